"""`accel demo`, README's first command: resnet18 on real digits, the plain loop against a plan, side by side."""
import json

from accel.cli import main


def test_demo_trains_both_ways_and_reports_every_accelerator(capsys):
    assert main(["demo", "--epochs", "1", "--image-size", "16", "--plan", "channels_last,amp,fused_optimizer",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plain"]["steps"] == result["accelerated"]["steps"] == 21  # 1,347 digits in batches of 64
    assert 0.2 < result["plain"]["accuracy"] <= 1 and 0.2 < result["accelerated"]["accuracy"] <= 1
    rows = {row["name"]: row for row in result["accelerated"]["report"]["accelerators"]}
    assert list(rows) == ["channels_last", "fused_optimizer", "amp"]
    assert all(row["reason"] for row in rows.values() if row["status"] == "skipped")


def test_demo_with_auto_shows_the_search_and_writes_the_chart(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "cache"))
    chart = tmp_path / "demo.png"
    assert main(["demo", "--epochs", "1", "--image-size", "16", "--budget", "20", "--plot", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "accel tune: chose" in out and "speed-up:" in out and "test acc" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_refuses_a_bad_plan_before_training(capsys):
    assert main(["demo", "--plan", "threads,compiel"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'compile'" in err and "Traceback" not in err
