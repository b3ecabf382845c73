"""The device a stage runs on, as values: what every GPU-only decision reads (issue 33).

A decision that differs between a CPU and a GPU (mixed precision and bf16 support, fused AdamW,
TF32, pinned memory, DDP's device ids, the gradient cache's memory budget, the limit the memory
check compares with, the device the inference stages take) is a small function of a
:class:`DeviceInfo`: the device's type, name, memory, bf16 support and compute capability.
:func:`device_info` reads them from torch for a real device (a CPU's bf16 from its flags,
:func:`cpu_flags`); a test gives them as values
(``DeviceInfo(type="cuda", total_memory=80 * 2**30, bf16=True, capability=(9, 0))``) and runs the
branch a GPU takes on a CPU, so the code that only runs on a GPU is tested on every CI run
(``tests/test_gpu_path.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

# Compute capability from which a GPU has bf16 and TF32 tensor cores (NVIDIA Ampere).
AMPERE = (8, 0)


@dataclass(frozen=True)
class DeviceInfo:
    """What the decisions of a stage need to know about its device."""

    type: str = "cpu"  # torch's device type: "cuda" or "cpu"
    index: int | None = None  # the GPU's index (None on a CPU)
    name: str = "cpu"  # e.g. "NVIDIA H100 80GB HBM3"
    total_memory: int = 0  # bytes of device memory (0 on a CPU: the host's is checked apart)
    # native bfloat16, not emulated: a GPU from Ampere (or ROCm), a CPU with AVX512-BF16 or AMX
    bf16: bool = False
    capability: tuple[int, int] = (0, 0)  # CUDA compute capability (0, 0 on a CPU)

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    @property
    def device(self) -> torch.device:
        return torch.device(self.type, self.index) if self.index is not None else torch.device(self.type)

    def describe(self) -> str:
        if not self.is_cuda:
            return f"{self.name} (native bf16)" if self.bf16 else self.name
        major, minor = self.capability
        bf16 = "native bf16" if self.bf16 else "no native bf16"
        return (
            f"{self.name} ({self.total_memory / 2**30:.1f} GiB, compute capability {major}.{minor}, {bf16})"
        )


CPU = DeviceInfo()


def native_bf16(capability: tuple[int, int], rocm: bool = False) -> bool:
    """Whether a GPU of ``capability`` computes in bfloat16 natively. ``torch.cuda.is_bf16_supported()``
    also says yes on a V100 or T4 (7.x), where bf16 is emulated without tensor cores and runs far
    slower than fp16: ``precision: auto`` must take fp16 there."""
    return rocm or tuple(capability) >= AMPERE


# CPU flags (/proc/cpuinfo) of the instructions that compute bfloat16 dot products natively:
# x86's AVX512-BF16 and AMX, Arm's BF16 extension. Without them torch emulates bf16 on a CPU,
# slower than fp32.
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags: the ``flags`` (x86) or ``Features`` (Arm) line of ``cpuinfo``
    (default: /proc/cpuinfo; none where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def device_info(device: str | torch.device | None = None) -> DeviceInfo:
    """The properties of ``device`` read from torch (default: :func:`stage_device`)."""
    device = stage_device() if device is None else torch.device(device)
    if device.type != "cuda":
        return DeviceInfo(type=device.type, name=device.type, bf16=bool(cpu_flags() & CPU_BF16_FLAGS))
    index = torch.cuda.current_device() if device.index is None else device.index
    props = torch.cuda.get_device_properties(index)
    capability = (int(props.major), int(props.minor))
    return DeviceInfo(
        type="cuda",
        index=index,
        name=str(props.name),
        total_memory=int(props.total_memory),
        bf16=native_bf16(capability, rocm=bool(torch.version.hip)),
        capability=capability,
    )


def choose_device(cuda_available: bool, local_rank: int = 0) -> torch.device:
    """The device a stage runs its model on: the process's GPU (``LOCAL_RANK`` under torchrun)
    when one is visible, else the CPU."""
    return torch.device("cuda", local_rank) if cuda_available else torch.device("cpu")


def stage_device() -> torch.device:
    """The device this process trains or infers on (:func:`choose_device` of what torch sees)."""
    return choose_device(torch.cuda.is_available(), int(os.environ.get("LOCAL_RANK", "0") or 0))
