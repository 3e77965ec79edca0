"""Every warning accel gives names the loop's own line (the first frame outside accel's and torch's folders), however
many accel layers are between: an accelerator's warning while accelerate() applies it was shown at accel's line
(amp's emulated dtype at accel/api.py), and accelerate()'s own at accel/search/__init__.py, the plan="auto" entry
every accel.accelerate() call goes through (found by ATK18; one ``loops_level()`` for every warning now)."""
from __future__ import annotations

import importlib.util
import os
import warnings

import pytest
import torch

import accel
from accel.errors import StaleWarning
from accel.testing import tiny_loader, tiny_model


def said(plan, **kwargs) -> tuple[list[warnings.WarningMessage], object]:
    model = tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), plan, **kwargs)
    return caught, run


def test_an_accelerators_warning_in_apply_is_shown_at_the_accelerate_line():
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    caught, run = said([{"threads": {"threads": cpus + 1}}], device="cpu")
    try:
        oversubscribed = [w for w in caught if "oversubscribe" in str(w.message)]
        assert len(oversubscribed) == 1, [str(w.message) for w in caught]
        assert oversubscribed[0].filename == __file__, oversubscribed[0].filename
        assert any("oversubscribe" in text for text in run.report.row("threads").warnings)  # and kept in the report
    finally:
        run.close()


@pytest.mark.skipif(importlib.util.find_spec("nni") is None, reason="needs nni")
def test_accelerates_own_stale_warning_is_shown_at_the_accelerate_line():
    caught, run = said(["prune"], device="cpu")  # prune trains its own copies of your model and optimizer
    try:
        stale = [w for w in caught if issubclass(w.category, StaleWarning)]
        assert stale and all(w.filename == __file__ for w in stale), [(w.filename, str(w.message)) for w in stale]
    finally:
        run.close()
