"""A user's script: a ddp (then an fsdp) run of one rank, closed and dropped, then a DataLoader whose worker collects
the garbage it inherited (as its collector may at any allocation). No test suite's gc.freeze() around the fork: the
worker loads its batches only because close ended the group (else it finalizes the parent's gloo group and hangs or
crashes). Prints each wrapper's batches.

    RANK=0 WORLD_SIZE=1 ... python closed_run_then_workers.py ddp fsdp"""
import gc
import sys

from torch.utils.data import DataLoader, Dataset

import accel
from accel.testing import tiny_loader, tiny_model, tiny_optimizer, train_steps


class Collecting(Dataset):
    """Each item collects the worker's garbage first, as its collector will on its own at some allocation."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        gc.collect()
        return index


if __name__ == "__main__":
    gc.disable()  # the closed run stays uncollected garbage in this process until the worker forks
    for wrapper in sys.argv[1:]:
        model = tiny_model()
        run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=[wrapper], device="cpu")
        train_steps(run)
        run.close()
        del run
        print(wrapper, [int(batch) for batch in DataLoader(Collecting(), num_workers=1, timeout=30)], flush=True)
