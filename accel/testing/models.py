"""accel.testing.models: TinyGPT and NormCNN, which live in accel.workloads.miniatures with every other model."""
from accel.workloads.miniatures import Block, NormCNN, Stage, TinyGPT  # noqa: F401
