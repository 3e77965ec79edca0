"""attack9: a sharded save that run.save refuses (a state run.load could not read back) leaves nothing behind: it wrote
every shard into a .partial folder before the refusal and kept it, a copy of the whole model that the message called
'not written'."""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from scripts.launching import one_rank_env

import accel
from accel import Accelerator, Stage, State
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model


@dataclass
class FolderState(State):
    folder: Any = field(default_factory=lambda: Path("runs"))  # a pathlib.Path: torch.load(weights_only) refuses it

    def state_dict(self) -> dict[str, Any]:
        return {"folder": self.folder}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.folder = saved["folder"]


class Folder(Accelerator[Any, FolderState]):
    name = "attack9_folder"
    stage = Stage.STEP
    requires = ("optimizer",)

    def apply(self, ctx) -> FolderState:
        return FolderState()


def test_a_refused_sharded_save_leaves_no_partial_folder(tmp_path, monkeypatch):
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    accel.register(Folder)
    model = tiny_model(0)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                           ["attack9_folder", "fsdp"], device="cpu")
    try:
        for _, (x, y) in zip(range(2), run.loader):
            run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
            run.step()
        with pytest.raises(CheckpointError, match="not written"):
            run.save(tmp_path / "shards")
    finally:
        run.close()
        accel.unregister(Folder.name)
    assert list((tmp_path / "shards").iterdir()) == []
