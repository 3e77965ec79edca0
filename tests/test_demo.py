"""`accel demo`, README's first command: resnet18 on real digits, the plain loop against a plan, trained in turns in
one process and compared by their paired turns, as plan="auto" measures."""
import json

from accel.cli import main


def test_demo_trains_both_ways_and_reports_every_accelerator(capsys):
    """Both ways learn the digits, and the accelerated run stays near the plain one. 3 epochs (63 steps) at 16 px:
    one epoch is not enough to mean anything (bf16 on an AMX Xeon was at chance, 0.111, after it). Measured after 3
    epochs, plain against channels_last+amp+fused_optimizer: 0.936 against 0.849 on a Zen 4 (avx512_bf16), 0.944
    against 0.922 on a Xeon with AMX; on a CPU without native bf16 amp is skipped and the two train alike. Chance
    is 0.1; the bounds hold with a margin on both kinds."""
    assert main(["demo", "--epochs", "3", "--image-size", "16", "--plan", "channels_last,amp,fused_optimizer",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    plain, accelerated = result["plain"], result["accelerated"]
    assert plain["steps"] == accelerated["steps"] == 63  # 1,347 digits in batches of 64, 3 epochs
    assert len(plain["turn_s"]) == len(accelerated["turn_s"]) == result["speedup"]["turns"] == 9  # turns of 7 steps
    speedup = result["speedup"]
    assert speedup["low"] <= speedup["estimate"] <= speedup["high"] and isinstance(speedup["noisy"], bool)
    assert result["expected_steps"] is None  # a plan given: nothing searches, nothing to tell
    assert plain["accuracy"] > 0.6 and accelerated["accuracy"] > 0.6, (plain["accuracy"], accelerated["accuracy"])
    assert abs(plain["accuracy"] - accelerated["accuracy"]) < 0.15, (plain["accuracy"], accelerated["accuracy"])
    rows = {row["name"]: row for row in accelerated["report"]["accelerators"]}
    assert list(rows) == ["channels_last", "fused_optimizer", "amp"]
    assert all(row["reason"] for row in rows.values() if row["status"] == "skipped")


def test_demo_with_auto_shows_the_search_and_writes_the_chart(tmp_path, capsys, monkeypatch):
    """plan="auto" is told the run's length before it starts (1 epoch of 21 batches), and the demo says what the
    search, settled ("chose"), records it was told."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "cache"))
    chart = tmp_path / "demo.png"
    assert main(["demo", "--epochs", "1", "--image-size", "16", "--budget", "20", "--plot", str(chart)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "accel tune: chose" in out and said_speedup(out) and "test acc" in out and "paired turns" in out
    assert "step" in captured.err and "step/s" not in out  # the progress bar: on stderr, from the first second
    assert "plan='auto' was told the run's length: expected_steps=21 (1 epoch x 21 batches)" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # what it says of a second run is what the cache holds: the plan only when the answer was kept
    kept = list((tmp_path / "cache").glob("*.json"))
    assert ("a second run takes the plan from the cache" in out) == bool(kept), out[-600:]
    assert ("so a second run measures again" in out) != bool(kept), out[-600:]


def test_demo_with_a_plan_given_says_nothing_of_a_search(capsys):
    """With --plan nothing searches and nothing is cached: it said "nothing was chosen, so a second run measures
    again" after a run that chose its plan itself."""
    assert main(["demo", "--epochs", "1", "--image-size", "16", "--plan", "channels_last", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert said_speedup(out) and "choosing the plan took" in out
    assert "second run" not in out and "nothing was chosen" not in out, out[-400:]


def test_demo_refuses_a_bad_plan_before_training(capsys):
    assert main(["demo", "--plan", "threads,compiel"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'compile'" in err and "Traceback" not in err


def said_speedup(out):
    """The headline: the speed-up with its interval, or plainly that the machine was too noisy for a verdict."""
    import re

    return bool(re.search(r"speed-up: \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d, 90% interval over \d+ paired turns\)", out)
                or re.search(r"slower: \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d, 90% interval", out)
                or re.search(r"no speed-up here: \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d, 90% interval", out)
                or re.search(r"the machine was too noisy for a verdict: the speed-up read \d+\.\d\dx", out))


def test_the_headline_tells_a_speed_up_from_none_and_from_noise():
    """A narrow interval about 1 is a measurement (no speed-up on this machine), not noise: the demo on a Cascade Lake
    read 1.00x (0.99-1.02) and said 'too noisy' before."""
    from accel.cli.demo import headline
    from accel.measure import Ratio

    assert headline(Ratio([1.30, 1.32, 1.29, 1.31, 1.30])).startswith("speed-up: 1.30x")
    assert headline(Ratio([1.0, 1.01, 0.99, 1.0, 1.02, 1.0])).startswith("no speed-up here: 1.00x")
    assert headline(Ratio([0.99, 0.985, 0.99, 0.995, 0.99])).startswith("no speed-up here: 0.99x")
    assert headline(Ratio([0.80, 0.82, 0.79, 0.81, 0.80])).startswith("slower: 0.80x")
    assert headline(Ratio([0.5, 2.0, 1.0, 1.6, 0.7])).startswith("the machine was too noisy for a verdict")


def test_the_turn_clock_stays_paused_across_two_plain_turns_in_a_row():
    """Turns alternate their order each round (plain, accelerated | accelerated, plain | plain, ...), so the plain
    loop takes two turns in a row: auto's clock must not count the first of them as its own time."""
    from accel.cli import demo

    now = [100.0]
    clock = demo.TurnClock(now=lambda: now[0])
    start = clock()
    for paused, step_s in ((True, 7.0), (False, 1.0), (False, 1.0), (True, 5.0), (True, 5.0), (False, 1.0)):
        clock.pause() if paused else clock.resume()
        now[0] += step_s
    assert clock() - start == 3.0  # the accelerated turns' seconds only
