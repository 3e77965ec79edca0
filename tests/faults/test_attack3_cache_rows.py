"""Found from outside (attack3): a plan cache entry's table (its ``rows``) is taken from the file as it is
(TuneResult.from_dict builds TuneRow(**row) unchecked), and only printing the report reads it: a crafted or
damaged entry whose plan passes every check makes ``print(run.report)`` raise in the user's loop, long after
accelerate(plan="auto") returned. A damaged entry should be measured again, as one without ``rows`` is."""
import warnings

import pytest
import torch
from test_cache_entry_trust import planted, searched_result

import accel


def opened(setup):
    """plan="auto" on the setup, one step of the README's loop taken (the cache is read at the first batch)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan="auto", device="cpu")
    x, y = next(iter(run.loader))
    run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
    run.step()
    return run


def planted_rows(folder, rows):
    """tiny_setup's objects, and an entry plan="auto" looks up for them, its plan channels_last, with these rows."""
    return planted(folder, {**searched_result({"channels_last": {}}), "rows": rows})


@pytest.mark.parametrize("row", [{"median_ms": "fast"}, {"ratio": [1, 2]}, {"ratio": {"samples": "abc"}}],
                         ids=["median_ms-text", "ratio-list", "samples-text"])
def test_a_damaged_cache_entrys_table_never_breaks_the_report(tmp_path, monkeypatch, row):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    setup = planted_rows(tmp_path, [{"name": "eager", "plan": {}, "status": "measured", **row}])
    run = opened(setup)
    try:
        assert "accel report" in str(run.report)
    finally:
        run.close()
