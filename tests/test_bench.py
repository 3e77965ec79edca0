"""accel bench: each plan in a fresh process; complete rows; valid JSON, CSV and PNG; ratios against eager."""
import csv
import json

import torch
import torchvision
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from accel.bench import CSV_FIELDS, add_ratios, bench, merge_rounds, plan_label, summarize, training_flops
from accel.cli import main

NUMBERS = ("median_ms", "min_ms", "max_ms", "stdev_ms", "first_step_s", "warmup_s", "setup_s", "peak_memory_mb",
           "gflop_per_step", "gflops", "peak_fraction", "vs_baseline", "speedup")


def test_cli_bench_on_a_tiny_model_writes_complete_rows_json_csv_and_png(tmp_path, capsys):
    paths = {kind: tmp_path / f"bench.{kind}" for kind in ("json", "csv", "png")}
    code = main(["bench", "--models", "tiny", "--image-size", "8", "--steps", "2", "--plans", "channels_last",
                 "--optimizer", "sgd", "--json", str(paths["json"]), "--csv", str(paths["csv"]),
                 "--plot", str(paths["png"])])
    assert code == 0
    data = json.loads(paths["json"].read_text())
    rows = data["rows"]
    assert [(r["model"], r["plan"], r["status"]) for r in rows] == [("tiny", "eager", "ok"),
                                                                    ("tiny", "channels_last", "ok")]
    for row in rows:
        assert all(isinstance(row[k], (int, float)) and row[k] >= 0 for k in NUMBERS), row
        assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert (row["steps"], row["warmup"], row["optimizer"], row["batch_size"]) == (2, 1, "sgd", 16)
        assert row["rounds"] == 1 and len(row["times_ms"]) == 2
    assert rows[0]["vs_baseline"] == 1.0 and rows[0]["applied"] == []
    assert rows[1]["applied"] == ["channels_last"]
    assert rows[1]["vs_baseline"] == round(rows[1]["median_ms"] / rows[0]["median_ms"], 3)
    assert data["machine"]["matmul_peak_gflops"] > 0
    with open(paths["csv"]) as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == CSV_FIELDS
        assert [r["plan"] for r in reader] == ["eager", "channels_last"]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "vs eager" in table and "channels_last" in table


def test_a_failing_run_is_an_error_row_not_a_crash():
    result = bench(models=["no_such_model"], plans=[], steps=1)
    (row,) = result.rows
    assert row["status"] == "error" and row["plan"] == "eager" and "no_such_model" in row["error"].lower()
    assert "error" in str(result)


def test_flops_are_three_forwards_close_to_the_counted_forward_and_backward():
    model = torchvision.models.resnet18(num_classes=1000)
    meta = model.to("meta")
    x = torch.empty(2, 3, 64, 64, device="meta")
    with FlopCounterMode(display=False) as counter:
        meta(x).sum().backward()
    estimate = training_flops(torchvision.models.resnet18(num_classes=1000), 2, 64)
    assert abs(estimate / counter.get_total_flops() - 1) < 0.05


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-4, 10.0), min_size=1, max_size=20))
def test_summary_orders_and_spreads(times):
    s = summarize(times)
    assert s["min_ms"] <= s["median_ms"] <= s["max_ms"]
    assert s["spread_pct"] >= 0 and s["stdev_ms"] >= 0


@settings(max_examples=50, deadline=None)
@given(base=st.floats(1.0, 1e4), other=st.floats(1.0, 1e4), gflops=st.floats(0.1, 100.0))
def test_ratios_are_against_the_same_models_eager_row(base, other, gflops):
    rows = [{"model": "m", "plan": "eager", "status": "ok", "median_ms": base, "gflops": gflops},
            {"model": "m", "plan": "x", "status": "ok", "median_ms": other, "gflops": gflops},
            {"model": "n", "plan": "x", "status": "ok", "median_ms": other, "gflops": gflops}]
    add_ratios(rows, peak_flops=200e9)
    assert rows[0]["vs_baseline"] == 1.0
    assert rows[1]["vs_baseline"] == round(other / base, 3) and rows[1]["speedup"] == round(base / other, 3)
    assert rows[2]["vs_baseline"] is None  # no eager row for model n
    assert abs(rows[1]["peak_fraction"] - gflops / 200) <= 0.0006


def test_plan_labels():
    assert plan_label([]) == "eager" and plan_label("auto") == "auto"
    assert plan_label(["compile", "channels_last"]) == "channels_last+compile"  # the library's order


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.floats(0.1, 1e4), min_size=1, max_size=5), min_size=1, max_size=4))
def test_rounds_pool_every_step(rounds):
    rows = [{"model": "m", "plan": "p", "status": "ok", "times_ms": times, "first_step_s": 1.0, "warmup_s": 1.0,
             "setup_s": 0.1, "peak_memory_mb": 100.0 + i, "gflop_per_step": 1.0} for i, times in enumerate(rounds)]
    row = merge_rounds(rows)
    pooled = [t for times in rounds for t in times]
    assert row["rounds"] == len(rounds) and row["times_ms"] == pooled
    assert row["min_ms"] == round(min(pooled), 3) and row["max_ms"] == round(max(pooled), 3)
    assert row["peak_memory_mb"] == 100.0 + len(rounds) - 1
    failed = merge_rounds(rows + [{"model": "m", "plan": "p", "status": "error", "error": "boom"}])
    assert failed["status"] == "error"


def test_a_misspelt_plan_fails_before_anything_is_measured(capsys):
    assert main(["bench", "--models", "tiny", "--plans", "chanels_last"]) == 2
    assert "did you mean 'channels_last'" in capsys.readouterr().err
