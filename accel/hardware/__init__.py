"""Everything accel knows about the machine and the runtime, found without importing anything unsafe.

The facts (facts.py: ``Hardware``), how probe() finds them in /sys, /proc and this process's memory maps
(probing.py), what is installed and whether it imports (packages.py: importing IPEX against the wrong torch kills
the process, so nothing optional is imported here), CPU lists (cpu_lists.py), the run's device (devices.py), and
where this process sits in a launched job (launcher.py, imported by its path: the launcher's environment, each
rank's cores). The process group is accel.distributed's.
"""
from accel.hardware.cpu_lists import format_cpu_list, parse_cpu_list
from accel.hardware.devices import device_problem, is_accelerator, resolve_device
from accel.hardware.facts import Hardware
from accel.hardware.packages import (
                                     IMPORT_PROBE_TIMEOUT_S,
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
                                     OPENMP_LIBRARIES,
                                     OPTIONAL_PACKAGES,
                                     hyperthread_siblings,
                                     loaded_openmp,
                                     probe,
)

__all__ = ["IMPORT_PROBE_TIMEOUT_S", "IPEX_IMPORT_HINTS", "ISA_FLAGS", "OPENMP_LIBRARIES", "OPTIONAL_PACKAGES",
           "PACKAGE_BACKENDS", "Hardware", "compile_backend_problem", "device_problem", "format_cpu_list",
           "hyperthread_siblings", "import_compile_backend", "import_problem", "importable", "install_hint",
           "ipex_problem", "is_accelerator", "loaded_openmp", "package_version", "parse_cpu_list", "probe",
           "resolve_device", "torch_version"]
