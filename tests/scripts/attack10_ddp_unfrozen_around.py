"""attack10: under ddp, a layer unfrozen after wrapping in a loop that steps its optimizer itself (never
run.step()): each rank says the StaleWarnings it heard, as (file, message)."""
import warnings

import torch
from scripts.launching import say

import accel
from accel.errors import StaleWarning
from accel.testing import tiny_loader, tiny_model

model = tiny_model()
model.fc1.requires_grad_(False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
run = accel.accelerate(model, optimizer, tiny_loader(), plan=["ddp"], device="cpu")
model.fc1.requires_grad_(True)
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    for _, (x, y) in zip(range(3), run.loader):
        loss = torch.nn.functional.cross_entropy(run.model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
say([[w.filename, str(w.message)] for w in said if issubclass(w.category, StaleWarning)])
run.close()
