"""``with run.autocast():`` on a closed run (run.close(), or accelerate() again on its model took it over and the loop
kept the old name) entered the closed plan's autocast silently, where run.backward()/run.step() say it: a loop stepping
its own optimizer ran its forwards in bfloat16 after the plan was undone, unsaid. Said once now, at the ``with`` line
(the first frame outside accel's and torch's folders and contextlib's, which the ``with`` goes through)."""
import warnings

import torch
from torch import nn

import accel
from accel.errors import StaleWarning
from accel.testing import tiny_loader, tiny_model


def test_autocast_on_a_closed_run_is_said_once_at_the_with_line():
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # amp's emulated bfloat16 on a CPU without it
        run = accel.accelerate(model, optimizer, tiny_loader(), [{"amp": {"dtype": "bfloat16"}}], device="cpu")
    run.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in tiny_loader():
            with run.autocast():  # the loop's own line
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.backward(nn.functional.cross_entropy(model(x), y))
    stale = [w for w in caught if issubclass(w.category, StaleWarning)]
    assert len(stale) == 1 and "run.autocast()" in str(stale[0].message), [str(w.message) for w in caught]
    assert stale[0].filename == __file__, stale[0].filename


def test_save_and_load_on_a_run_taken_over_are_said(tmp_path):
    """run.save() of the run accelerate() again took over checkpointed its undone plan and counters, and run.load()
    resumed it while the run training now started afresh: both silently."""
    for call in (lambda earlier: earlier.save(tmp_path / "c.pt"), lambda earlier: earlier.load(tmp_path / "c.pt")):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        earlier = accel.accelerate(model, optimizer, tiny_loader(), [{"grad_accumulation": {"steps": 2}}],
                                   device="cpu")
        run = accel.accelerate(model, optimizer, tiny_loader(), [], device="cpu")  # takes the model over
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call(earlier)
        run.close()
        stale = [w for w in caught if issubclass(w.category, StaleWarning)]
        assert len(stale) == 1 and stale[0].filename == __file__, [(w.filename, str(w.message)) for w in caught]


def test_a_run_you_closed_saves_what_it_trained_unsaid(tmp_path):
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), [], device="cpu")
    run.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run.save(tmp_path / "final.pt")  # train, close, save: the order of many loops
