"""Habits of real loops that accelerators must not trip on: a batch tensor changed in place after the forward
(loss-masking code normalising its mask), and weights updated by hand with no optimizer (pytorch/examples'
word_language_model: clip_grad_norm_, then p.data.add_(p.grad, alpha=-lr))."""
from __future__ import annotations

import torch

from accel.testing.trace import Loop


class InplaceInput(Loop):
    """After the forward, before the backward, the loop normalises the batch's mask in place (the zoo's loss reads
    its mean; the plain training saves none of it: a change the plain loop may make, and a recomputation of a
    checkpointed module that was handed the mask must not see). The zoo's step does it (``changes_inputs``)."""

    name = "inplace_input"
    changes_inputs = True


class ManualUpdate(Loop):
    """word_language_model's loop: no optimizer; zero_grad on the model, backward, the true gradients
    (run.unscale_gradients()) clipped to 0.25, then each weight moved by hand. Never run.step()."""

    name = "manual_update"
    lr = 0.5

    def step(self, index, run, held, batch, loss_of):
        held.model.zero_grad()
        with run.autocast():
            loss = loss_of(run, batch)
        run.backward(loss)
        run.unscale_gradients()
        torch.nn.utils.clip_grad_norm_(held.model.parameters(), 0.25)
        with torch.no_grad():
            for param in held.model.parameters():
                if param.grad is not None:
                    param.data.add_(param.grad, alpha=-self.lr)
        return loss.detach()
