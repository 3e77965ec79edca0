"""attack7: a loop that steps its learning-rate scheduler every batch under grad_accumulation (a port of Hugging Face
transformers' run_glue_no_trainer.py loop, where Accelerate's scheduler wrapper skips the micro-batches that did not
step the optimizer): the schedule, counted in updates, ran N times too fast, and nothing said so."""
import math
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.errors import LoopWarning


def linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    """transformers.get_linear_schedule_with_warmup, as the no_trainer scripts build it (get_scheduler("linear"))."""
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def no_trainer_epoch(steps_per_update, every_batch=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
    no_decay = ["bias"]
    groups = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
               "weight_decay": 0.01},
              {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=5e-5)
    loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))), batch_size=4, shuffle=True)
    num_update_steps_per_epoch = math.ceil(len(loader) / steps_per_update)  # as the script computes it
    lr_scheduler = linear_schedule_with_warmup(optimizer, 1, num_update_steps_per_epoch)
    run = accel.accelerate(model, optimizer, loader, plan={"grad_accumulation": {"steps": steps_per_update}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for inputs, labels in run.loader:  # with accelerator.accumulate(model): ... as the run's calls
            loss = nn.functional.cross_entropy(run.model(inputs), labels)
            run.backward(loss)
            held = run.step()
            if every_batch or not held:
                lr_scheduler.step()  # Accelerate skips it on the micro-batches; here it runs on each
    run.close()
    return [w for w in caught if issubclass(w.category, LoopWarning)]


def test_a_scheduler_stepped_on_every_micro_batch_is_said():
    said = no_trainer_epoch(2)
    assert len(said) == 1 and "run.step()" in str(said[0].message) and "learning rate" in str(said[0].message)


def test_a_scheduler_stepped_on_each_update_is_not_warned():
    """The card's loop: ``if not run.step(): scheduler.step()``."""
    assert no_trainer_epoch(2, every_batch=False) == []


def test_a_run_resumed_mid_accumulation_is_not_warned(tmp_path):
    """The learning rates seen while holding are not in the checkpoint: a run loaded mid-accumulation compares none."""
    def build():
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
        return model, torch.optim.SGD(model.parameters(), lr=0.1), loader

    plan = {"grad_accumulation": {"steps": 4}}
    run = accel.accelerate(*build(), plan=plan)
    batches = iter(run.loader)
    x, y = next(batches)
    run.backward(nn.functional.mse_loss(run.model(x), y))
    run.step()
    run.save(tmp_path / "run.pt")
    run.close()
    again = accel.accelerate(*build(), plan=plan)
    again.load(tmp_path / "run.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoopWarning)
        for x, y in again.loader:
            again.backward(nn.functional.mse_loss(again.model(x), y))
            again.step()
    again.close()


def test_a_scheduler_stepped_each_epoch_with_an_update_across_the_epochs_end_is_not_warned():
    """8 batches an epoch, 3 per update: one update holds the last batches of an epoch and the first of the next,
    and a per-epoch StepLR moves the rate inside it, once an epoch: not a scheduler stepped every batch."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 2)), batch_size=2)
    run = accel.accelerate(model, optimizer, loader, plan={"grad_accumulation": {"steps": 3}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoopWarning)
        for _ in range(4):
            for x, y in run.loader:
                run.backward(nn.functional.mse_loss(run.model(x), y))
                run.step()
            scheduler.step()
    run.close()
