"""One rank under `accel launch --nproc-per-node 1` (tests/cuda/test_cuda_launch.py): a GPT-style model trained on
this rank's GPU by the plain loop, then by each plan given (ddp, fsdp over nccl), each from the same seed; under fsdp
a sharded checkpoint is saved and loaded back. Writes what each trained, its report and what it saw to --out.

A plan that fails is recorded with its error and the next one still runs.
"""
import argparse
import json
import tempfile
import traceback

import torch
from torch.nn.functional import cross_entropy
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.workloads import TinyGPT

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--plans", required=True, help="a JSON list of plans")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--device", default="auto")
args = parser.parse_args()


def objects():
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, width=64, layers=2, heads=4, context=32)
    ids = torch.randint(0, 64, (128, 33), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(7))
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01), loader


def train(plan) -> dict:
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, plan=plan, device=args.device)
    seen = {"device": str(run.device), "report": run.report.to_dict(),
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "parameters_on": sorted({str(getattr(p, "_local_tensor", p).device) for p in run.unwrap().parameters()}),
            "optimizer_state_on": [], "losses": []}
    while len(seen["losses"]) < args.steps:
        for x, y in run.loader:
            with run.autocast():
                loss = cross_entropy(run.model(x).flatten(0, 1).float(), y.flatten())
            run.backward(loss)
            run.step()
            seen["losses"].append(loss.item())
            if len(seen["losses"]) == args.steps:
                break
    seen["optimizer_state_on"] = sorted({str(getattr(s, "_local_tensor", s).device) for state in
                                         run.optimizer.state.values() for s in state.values()
                                         if isinstance(s, torch.Tensor) and s.dim()})
    if run.sharded:  # a DCP folder, every rank its shards, over this group; loaded back into the same run
        with tempfile.TemporaryDirectory() as folder:
            before = {k: v.full_tensor().cpu() for k, v in run.unwrap().state_dict().items()}
            run.save(f"{folder}/ckpt")
            info = run.load(f"{folder}/ckpt")
            after = {k: v.full_tensor().cpu() for k, v in run.unwrap().state_dict().items()}
            seen["checkpoint"] = {"step": info["step"], "same": all(torch.equal(before[k], after[k]) for k in before)}
    run.close()
    seen["params"] = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}  # yours, trained
    seen["params_on"] = sorted({str(p.device) for p in model.parameters()})
    return seen


results = {}
for plan in [[], *json.loads(args.plans)]:
    key = json.dumps(plan)
    try:
        results[key] = train(plan)
    except Exception:  # said, and the next plan runs
        results[key] = {"error": traceback.format_exc()}
    print(f"{key}: {'error' if 'error' in results[key] else 'ok'}", flush=True)
torch.save(results, args.out)
print("OK", flush=True)
