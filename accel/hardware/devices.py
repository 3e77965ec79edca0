"""Which device a run trains on: 'auto' and a device type resolved to one device of this machine (each rank of a
launched job on its own GPU), and why a device cannot be used here."""
from __future__ import annotations

import torch

from accel.hardware.probing import Hardware, probe


def resolve_device(device: str | torch.device | None = "auto", local_rank: int = 0,
                   hardware: Hardware | None = None) -> torch.device:
    """'auto' picks cuda, xpu, mps, else cpu; a device type without an index picks this local rank's device; any
    torch device string is taken as is. ``hardware``: the machine to resolve for (default: this one)."""
    if device is None or device == "auto":
        devices = (hardware or probe()).devices
        kind = next((k for k in ("cuda", "xpu", "mps") if devices.get(k)), "cpu")
        device = torch.device(kind)
    device = torch.device(device)
    if device.index is None and device.type not in ("cpu", "mps", "meta"):
        count = (hardware or probe()).devices.get(device.type, 0)
        return torch.device(device.type, local_rank if count > 1 else 0)
    return device


def device_problem(device: torch.device, hardware: Hardware) -> str | None:
    """Why a run cannot use this device here (absent, or an index past the last one), or None."""
    if device.type == "cpu":
        return None
    found = ", ".join(f"{kind} x{count}" if kind != "cpu" else kind for kind, count in hardware.devices.items())
    count = hardware.devices.get(device.type, 0)
    if not count:
        return f"there is no {device.type} device here (found: {found})"
    if device.index is not None and device.index >= count:
        return f"{device} does not exist: {count} {device.type} device(s) here, indices 0-{count - 1}"
    return None


def is_accelerator(device: torch.device) -> bool:
    """True for devices with their own memory (batches cross a bus to reach them)."""
    return device.type not in ("cpu", "meta")


def device_model(device: torch.device) -> str:
    """The device's type, and its model where torch names it (an H100's answer is not an A100's)."""
    module = getattr(torch, device.type, None)
    if device.type == "cpu" or not hasattr(module, "get_device_name"):
        return device.type
    return f"{device.type} {module.get_device_name(device)}"
