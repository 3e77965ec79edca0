"""Built-in accelerators: one module each. Importing a module registers its accelerator.

Modules are discovered, so adding an accelerator means adding a module here and nothing else.
Optional packages (nni, ipex) are imported inside apply(), never at module import.
"""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
