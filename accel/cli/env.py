"""accel env: the machine and runtime as accel sees them, and whether each accelerator can run here, with why."""
from __future__ import annotations

import argparse
import json
from typing import Any

import torch

import accel
from accel.api import prepare
from accel.errors import PlanError
from accel.hardware import ipex_problem, package_version, probe
from accel.plan.contract import REGISTRY, packages
from accel.workloads import tiny_loader, tiny_model, tiny_optimizer


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("env", help="hardware, runtime and every accelerator's availability with the reason")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def accelerator_availability() -> dict[str, dict[str, Any]]:
    """For each registered accelerator: its required packages and what its plan-time decisions and checks say on
    this machine, against a tiny real model on cpu (nothing is applied)."""
    found = {}
    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        entry: dict[str, Any] = {"stage": cls.stage.name.lower(),
                                 "requires": {pkg: package_version(pkg) for pkg in packages(cls)}}
        try:
            model = tiny_model()
            accelerator = cls(**cls.Options.example)
            _, _, skips = prepare(model, tiny_optimizer(model), tiny_loader(32), [accelerator], device="cpu")
            entry["available"] = True
            entry["reason"] = (f"would be skipped here: {skips[name]}" if name in skips
                               else "its checks pass on cpu with a tiny model")
        except PlanError as error:
            entry["available"] = False
            entry["reason"] = "; ".join(p.message + (f" ({p.allowed})" if p.kind == "missing" and
                                                     str(p.allowed).startswith("pip install") else "")
                                        for p in error.problems)
        except Exception as error:  # a check that breaks is reported, not fatal
            entry["available"], entry["reason"] = False, f"its check raised {type(error).__name__}: {error}"
        found[name] = entry
    return found


def environment() -> dict[str, Any]:
    """Hardware, runtime and accelerator availability as data (what `accel env --json` prints)."""
    hardware = probe()
    return {
        "accel": accel.__version__,
        "hardware": {**hardware.to_dict(), "native_bf16": hardware.native_bf16, "native_fp16": hardware.native_fp16},
        "runtime": {"torch_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
                    "mkldnn": torch.backends.mkldnn.is_available(), "cuda_build": torch.version.cuda,
                    "ipex": ipex_problem() or "installed, and its version matches torch's: safe to import"},
        "accelerators": accelerator_availability(),
    }


def run(args) -> int:
    data = environment()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    hw, rt = data["hardware"], data["runtime"]
    numa = ", ".join(f"node {k}: cpus {','.join(map(str, v))}" for k, v in hw["numa_nodes"].items())
    lines = [
        f"accel {data['accel']}",
        f"cpu        {hw['cpu_model']}: {hw['physical_cores']} physical cores, {hw['logical_cpus']} logical, "
        f"{len(hw['cpus_allowed'])} allowed to this process",
        f"numa       {numa or 'not exposed'}",
        f"isa        {', '.join(hw['isa']) or 'no AVX2'} (torch uses {hw['torch_cpu_capability']}); "
        f"native bf16: {'yes' if hw['native_bf16'] else 'no'}, native fp16: {'yes' if hw['native_fp16'] else 'no'}",
        f"openmp     {hw['openmp']}; torch threads {rt['torch_threads']} (inter-op {rt['interop_threads']}), "
        f"mkldnn {'yes' if rt['mkldnn'] else 'no'}",
        f"devices    {', '.join(f'{k} x{v}' for k, v in hw['devices'].items())}",
        "versions   " + ", ".join(f"{k} {v}" for k, v in hw["versions"].items() if v is not None),
        "missing    " + (", ".join(k for k, v in hw["versions"].items() if v is None) or "none"),
        f"ipex       {rt['ipex']}",
        "",
        "accelerators (plan-time checks on cpu, tiny model):",
    ]
    width = max((len(n) for n in data["accelerators"]), default=0)
    for name, entry in data["accelerators"].items():
        mark = "available  " if entry["available"] else "unavailable"
        lines.append(f"  {name.ljust(width)}  {mark}  {entry['reason']}")
    print("\n".join(lines))
    return 0
