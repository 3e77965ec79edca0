"""Built-in accelerators: one module each, or one package where it does more than one job (fsdp, prune: the
accelerator and its card in the package's __init__, its parts beside it). Importing one registers it.

Modules and packages are discovered, so adding an accelerator means adding one here and nothing else.
Optional packages (nni, ipex) are imported inside apply(), never at module import.
"""
import importlib
import pkgutil

__all__: list[str] = []  # nothing: each accelerator is imported from its own module

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
