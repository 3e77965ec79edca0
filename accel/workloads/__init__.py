"""What accel trains, in one place: the book's CNNs on real digits, the workloads people train today (Hugging Face,
timm, torchvision, an LSTM: ``WORKLOADS``), small models shaped like GPT-2 and ResNet, and the tiny objects of tests.
"""
from accel.workloads.book import BookCNN, TinyCNN, accuracy, cifar_shaped, digits_datasets
from accel.workloads.catalog import SIZES, WORKLOADS, Tagger, Workload
from accel.workloads.miniatures import NormCNN, TinyGPT, tiny_loader, tiny_model, tiny_optimizer

__all__ = ["SIZES", "WORKLOADS", "BookCNN", "NormCNN", "Tagger", "TinyCNN", "TinyGPT", "Workload", "accuracy",
           "cifar_shaped", "digits_datasets", "tiny_loader", "tiny_model", "tiny_optimizer"]
