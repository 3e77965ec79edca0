"""Everything accel knows about the machine and the runtime, found without importing anything unsafe: the facts
and probe() (probing.py), what is installed and whether it imports (packages.py: nothing optional is imported
here), the run's device (devices.py), and where this process sits in a launched job (launcher.py)."""
from accel.hardware.devices import device_problem, is_accelerator, resolve_device
from accel.hardware.packages import (
                                     IPEX_IMPORT_HINTS,
                                     PACKAGE_BACKENDS,
                                     compile_backend_problem,
                                     import_compile_backend,
                                     import_problem,
                                     importable,
                                     install_hint,
                                     ipex_problem,
                                     package_version,
                                     torch_version,
)
from accel.hardware.probing import (
                                     ISA_FLAGS,
                                     Hardware,
                                     format_cpu_list,
                                     hyperthread_siblings,
                                     loaded_openmp,
                                     parse_cpu_list,
                                     probe,
)

__all__ = ["IPEX_IMPORT_HINTS", "ISA_FLAGS", "PACKAGE_BACKENDS", "Hardware", "compile_backend_problem",
           "device_problem", "format_cpu_list", "hyperthread_siblings", "import_compile_backend", "import_problem",
           "importable", "install_hint", "ipex_problem", "is_accelerator", "loaded_openmp", "package_version",
           "parse_cpu_list", "probe", "resolve_device", "torch_version"]
