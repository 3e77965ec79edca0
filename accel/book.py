"""accel.book moved to accel.workloads.book (the book's CNNs and digits, beside every other workload); this name
warns until 0.4."""
import warnings

from accel.workloads.book import BookCNN, TinyCNN, accuracy, cifar_shaped, digits_datasets  # noqa: F401

warnings.warn("accel.book is accel.workloads.book since 0.3 (also importable from accel.workloads); accel.book "
              "goes in 0.4", DeprecationWarning, stacklevel=2)
