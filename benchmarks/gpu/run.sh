#!/usr/bin/env bash
# The GPU check in one command (docs/gpu.md): the environment, the tests marked cuda (tests/cuda), then the GPU
# benchmark (benchmarks/gpu/bench_gpu.py). Needs only this repository and torch, torchvision, accelerate,
# transformers, pytest and hypothesis installed; accel runs from the working tree (PYTHONPATH), nothing is installed.
#
# Writes into $OUT (else ./gpu-check, gitignored), at most 8 files: 0-summary.txt (each part's exit status, every
# test's outcome, the benchmark's numbers), 1-env.txt, 2-tests.log, 2-tests.xml, 3-bench.log, 3-bench.json.
# One part failing never stops the others; the exit status is nonzero at the end if any part failed.
#
# Settings (environment variables):
#   ACCEL_GPU_CHECK_PARTS       env,tests,bench   the parts to run
#   ACCEL_GPU_CHECK_TESTS       tests/cuda/*.py   what pytest runs, in this order (e.g. one file, or -k ...)
#   ACCEL_GPU_CHECK_TESTS_S     210               the cuda tests' time limit, s (then interrupted: results kept)
#   ACCEL_GPU_CHECK_BENCH_S     200               the benchmark's time budget, s (it adapts to it)
#   ACCEL_GPU_CHECK_BENCH_ARGS                    more arguments for bench_gpu.py (e.g. --models gpt2)
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-}
if [[ -z $PY ]]; then  # the interpreter that has torch
  for PY in python3 python; do "$PY" -c "import torch" 2>/dev/null && break; done
fi
PARTS=${ACCEL_GPU_CHECK_PARTS:-env,tests,bench}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export ACCEL_CACHE_DIR=${ACCEL_CACHE_DIR:-$(mktemp -d)}  # nothing remembered from an earlier run
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT  # a single process, not a launched rank
STATUS=()

part() {  # part NAME COMMAND...: run it unless PARTS leaves it out; record "name:exit status:seconds"
  local name=$1 start=$SECONDS rc
  shift
  if [[ ",$PARTS," != *",$name,"* ]]; then STATUS+=("$name:-:0"); return; fi
  echo "== $name: $(date -u +%H:%M:%S)"
  "$@"
  rc=$?
  STATUS+=("$name:$rc:$((SECONDS - start))")
  echo "== $name: exit $rc after $((SECONDS - start)) s"
  summarize > /dev/null  # after every part: a run stopped later still leaves its summary so far
}

summarize() {
  "$PY" benchmarks/gpu/summary.py "$OUT" "${STATUS[@]}" \
    || printf '%s\n' "summary failed; parts: ${STATUS[*]}" | tee "$OUT/0-summary.txt"
}

environment() {
  {
    echo "date: $(date -u)"; echo "host: $(uname -a)"; echo "cpus: $(nproc)"; echo "repository: $ROOT $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
    echo "--- nvidia-smi"; nvidia-smi 2>&1 || echo "nvidia-smi: not available here"
    echo "--- python, torch, packages"
    "$PY" - <<'PYTHON'
import importlib.metadata as metadata, sys, torch
print(sys.version)
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "available", torch.cuda.is_available(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")
for i in range(torch.cuda.device_count()):
    print(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i), "bf16", torch.cuda.is_bf16_supported())
for name in ("torchvision", "triton", "accelerate", "transformers", "timm", "peft", "pytest", "hypothesis",
             "scikit-learn", "numpy", "nni", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cudnn-cu12"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "-")
PYTHON
    echo "--- accel env"; "$PY" -m accel env
  } > "$OUT/1-env.txt" 2>&1
}

# the basic paths first (and the attacks' short cases), the longest last: a run cut short by the limit loses the least
CUDA_TESTS="tests/cuda/test_cuda_paths.py tests/cuda/test_attack*.py tests/cuda/test_cuda_launch.py
  tests/cuda/test_cuda_compile.py tests/cuda/test_cuda_zoo.py tests/cuda/test_cuda_auto.py"

tests() {
  local limit=${ACCEL_GPU_CHECK_TESTS_S:-210} selection
  eval "selection=(${ACCEL_GPU_CHECK_TESTS:-$CUDA_TESTS})"  # pytest's arguments, quotes kept: -k 'fsdp and not amp'
  # SIGINT at the limit: pytest stops and still writes its results; a process stuck in CUDA or NCCL is killed later
  timeout -s INT -k 20 "$limit" "$PY" -m pytest -p no:cacheprovider -v -rA --durations=25 \
    -o faulthandler_timeout=150 --junitxml="$OUT/2-tests.xml" "${selection[@]}" > "$OUT/2-tests.log" 2>&1
}

bench() {
  local budget=${ACCEL_GPU_CHECK_BENCH_S:-200} more
  eval "more=(${ACCEL_GPU_CHECK_BENCH_ARGS:-})"
  timeout -s INT -k 20 "$((budget + 80))" "$PY" benchmarks/gpu/bench_gpu.py --budget-s "$budget" \
    --json "$OUT/3-bench.json" "${more[@]}" > "$OUT/3-bench.log" 2>&1
}

part env environment
part tests tests
part bench bench
summarize
for entry in "${STATUS[@]}"; do
  rc=${entry#*:}; rc=${rc%%:*}
  [[ $rc == "0" || $rc == "-" ]] || exit 1
done
exit 0
