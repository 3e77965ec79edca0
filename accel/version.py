"""accel's version: one place, read by accel/__init__.py and by pyproject.toml (setuptools' dynamic version)."""
__version__ = "0.4.0"
