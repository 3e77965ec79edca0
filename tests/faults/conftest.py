"""Fixtures of the fault suite; the injectors themselves are in injectors.py."""
from injectors import read_only_folder  # noqa: F401  (a fixture)
