"""`accel demo`, README's first command: trains on real digits, plain and through a plan, and reports."""
import json

import pytest

from accel import PlanError
from accel.cli import main


def test_demo_trains_both_ways_and_prints_the_report(capsys):
    assert main(["demo", "--epochs", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plain"]["accuracy"] > 0.85
    assert abs(result["accelerated"]["accuracy"] - result["plain"]["accuracy"]) <= 0.05
    rows = {row["name"]: row for row in result["accelerated"]["report"]["accelerators"]}
    assert list(rows) == ["threads", "loader", "channels_last", "amp"]
    assert all(row["status"] in ("applied", "skipped") for row in rows.values())
    assert all(row["reason"] for row in rows.values() if row["status"] == "skipped")


def test_demo_refuses_a_bad_plan_with_the_plan_error():
    with pytest.raises(PlanError, match="did you mean 'compile'"):
        main(["demo", "--plan", "threads,compiel"])
