"""accel bench: plans interleaved in one process; complete rows with intervals; JSON, CSV and PNG; honest peaks."""
import csv
import json
import re

import pytest
import torch
import torchvision
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from accel.bench import CSV_FIELDS, BenchResult, add_ratios, bench
from accel.cli import main
from accel.hardware import probe
from accel.measure import matmul_peaks, peak_dtype, plan_label, summarize, training_flops

NUMBERS = ("median_ms", "min_ms", "max_ms", "stdev_ms", "first_step_s", "warmup_s", "setup_s", "gflop_per_step",
           "gflops", "vs_baseline", "speedup")


def test_cli_bench_on_a_tiny_model_writes_complete_rows_json_csv_and_png(tmp_path, capsys):
    paths = {kind: tmp_path / f"bench.{kind}" for kind in ("json", "csv", "png")}
    code = main(["bench", "--models", "tiny", "--rounds", "3", "--steps", "2",  # tiny's 3x8x8 images by default
                 "--plans", "channels_last", "amp", "--optimizer", "sgd", "--json", str(paths["json"]),
                 "--csv", str(paths["csv"]), "--plot", str(paths["png"])])
    assert code == 0
    data = json.loads(paths["json"].read_text())
    rows = data["rows"]
    assert data["settings"]["image_size"] == 8
    assert [(r["model"], r["plan"], r["status"]) for r in rows] == [
        ("tiny", "eager", "ok"), ("tiny", "channels_last", "ok"), ("tiny", "amp", "ok")]
    for row in rows:
        assert all(isinstance(row[k], (int, float)) and row[k] >= 0 for k in NUMBERS), row
        assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert (row["rounds"], row["steps"], row["optimizer"], row["batch_size"]) == (3, 2, "sgd", 16)
        assert len(row["times_ms"]) == 6  # 3 rounds x 2 steps, interleaved with the other plans
    assert rows[0]["vs_baseline"] == 1.0 and rows[0]["applied"] == [] and rows[0]["dtype"] == "fp32"
    assert rows[1]["applied"] == ["channels_last"]
    for row in rows[1:]:
        assert row["ratio_low"] <= row["vs_baseline"] <= row["ratio_high"]
        assert row["noise"] == (row["ratio_low"] < 1.0 < row["ratio_high"])
    peaks = data["machine"]["peaks_gflops"]
    assert peaks["fp32"] > 0
    if probe().native_bf16:  # amp computes in bf16 here: its row is held against the bf16 peak
        assert rows[2]["dtype"] == "bf16" and rows[2]["peak_gflops"] == peaks["bf16"]
    with open(paths["csv"]) as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == CSV_FIELDS
        assert [r["plan"] for r in reader] == ["eager", "channels_last", "amp"]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out, err = capsys.readouterr()
    assert "vs eager (90%)" in out and "channels_last" in out and "matmul peaks" in out
    assert "100% of 6 phases" in err  # 3 plans set up and 3 rounds: the bar counts what it says


@pytest.mark.slow
def test_the_progress_bar_moves_while_auto_searches(capsys):
    assert main(["bench", "--models", "tiny", "--image-size", "8", "--plans", "auto", "--rounds", "2", "--steps", "1",
                 "--tune-budget", "3"]) == 0
    err = capsys.readouterr().err
    searching = [int(m[1]) for m in re.finditer(r"auto's search, step \d+ \|[^|]*\| +(\d+)% of 5 phases", err)]
    assert searching and max(searching) > 0, err[-2000:]  # not stuck at 0% through the search
    assert "100% of 5 phases" in err


def test_a_row_above_its_peak_is_explained_under_the_table():
    row = {"model": "resnet18", "plan": "ipex", "status": "ok", "median_ms": 100.0, "spread_pct": 2.0,
           "warmup_s": 0.1, "gflops": 185.0, "dtype": "fp32", "vs_baseline": 0.5, "ratio_low": 0.4,
           "ratio_high": 0.6, "noise": False}
    add_ratios([row], {"fp32": 100e9, "bf16": 400e9})
    text = str(BenchResult([row], {"peaks_gflops": {"fp32": 100.0, "bf16": 400.0}}))
    assert "185% fp32*" in text and "* resnet18 ipex: 185% of the fp32 peak measured: it is 46% of bf16's" in text
    add_ratios([row], {"fp32": 100e9})
    text = str(BenchResult([row], {"peaks_gflops": {"fp32": 100.0}}))
    assert "short matmul probe read low" in text
    row["gflops"] = 90.0
    add_ratios([row], {"fp32": 100e9})
    assert "*" not in str(BenchResult([row], {"peaks_gflops": {"fp32": 100.0}}))


def test_a_model_that_cannot_be_built_is_an_error_row_not_a_crash():
    result = bench(models=["resnet18_but_not_really"], plans=[], rounds=1)
    (row,) = result.rows
    assert row["status"] == "error" and row["plan"] == "eager" and "resnet18_but_not_really" in row["error"].lower()
    assert "error" in str(result)


def test_a_model_that_cannot_run_at_the_size_asked_is_an_error_row_not_a_crash():
    result = bench(models=["tiny"], plans=[], rounds=1, image_size=224)
    (row,) = result.rows
    assert row["status"] == "error" and row["plan"] == "eager"


def test_unknown_models_and_misspelt_plans_fail_before_anything_is_measured(capsys):
    assert main(["bench", "--models", "resnt18", "tiny"]) == 2
    assert "unknown model(s): resnt18 (did you mean 'resnet18'?)" in capsys.readouterr().err
    assert main(["bench", "--models", "tiny", "--plans", "chanels_last"]) == 2
    assert "did you mean 'channels_last'" in capsys.readouterr().err


def test_flops_are_three_forwards_close_to_the_counted_forward_and_backward():
    model = torchvision.models.resnet18(num_classes=1000)
    meta = model.to("meta")
    x = torch.empty(2, 3, 64, 64, device="meta")
    with FlopCounterMode(display=False) as counter:
        meta(x).sum().backward()
    estimate = training_flops(torchvision.models.resnet18(num_classes=1000), torch.empty(2, 3, 64, 64))
    assert abs(estimate / counter.get_total_flops() - 1) < 0.05


def test_peaks_are_measured_for_each_dtype_the_hardware_computes_natively():
    hardware = probe()
    peaks = matmul_peaks("cpu", hardware, size=256)
    assert set(peaks) == {"fp32"} | ({"bf16"} if hardware.native_bf16 else set()) | (
        {"fp16"} if hardware.native_fp16 else set())
    assert all(p > 0 for p in peaks.values())
    assert (peak_dtype(torch.bfloat16), peak_dtype(torch.float16), peak_dtype(None)) == ("bf16", "fp16", "fp32")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-4, 10.0), min_size=1, max_size=20))
def test_summary_orders_and_spreads(times):
    s = summarize(times)
    assert s["min_ms"] <= s["median_ms"] <= s["max_ms"]
    assert s["spread_pct"] >= 0 and s["stdev_ms"] >= 0


@settings(max_examples=50, deadline=None)
@given(ratio=st.floats(0.05, 20.0), gflops=st.floats(0.1, 100.0), dtype=st.sampled_from(["fp32", "bf16"]))
def test_each_row_is_held_against_the_peak_of_its_own_dtype(ratio, gflops, dtype):
    rows = [{"status": "ok", "vs_baseline": ratio, "gflops": gflops, "dtype": dtype}]
    add_ratios(rows, {"fp32": 150e9, "bf16": 400e9})
    peak = 150e9 if dtype == "fp32" else 400e9
    assert abs(rows[0]["peak_fraction"] - gflops * 1e9 / peak) <= 0.0006
    assert rows[0]["speedup"] == round(1 / ratio, 3)


def test_plan_labels():
    assert plan_label([]) == "eager" and plan_label("auto") == "auto"
    assert plan_label(["compile", "channels_last"]) == "channels_last+compile"  # the library's order
