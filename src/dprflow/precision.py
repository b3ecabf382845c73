"""Numeric precision of training and inference: one setting, resolved per device.

The config's ``precision`` (``auto``, ``bf16``, ``fp16``, ``fp32``) reaches every stage that runs
a model: the training stages (mixed precision with ``torch.autocast``; fp16 with a loss scaler)
and the inference stages (corpus encoding, query encoding in dense search, reranking, teacher
scoring, doc2query generation). :func:`resolve_precision` turns the setting into what a device
runs:

- on a CPU, ``auto`` is fp32 (the CPU numbers stay what they were). ``bf16`` is an opt-in where
  the CPU computes it natively (AVX512-BF16 or AMX; :data:`dprflow.hardware.CPU_BF16_FLAGS`):
  encoding there takes 0.56 of fp32's time, and no metric moved significantly on Cranfield or
  SciFact (bench/RESULTS.md, "bf16 on a CPU"); elsewhere, and for ``fp16``, the CPU runs fp32
  and says so once;
- on a GPU, ``auto`` is bf16 where the GPU computes it natively (Ampere and later, compute
  capability 8.0; :func:`dprflow.hardware.native_bf16`) and fp16 elsewhere; ``bf16`` on a GPU
  without it is an error, not a silent fallback. (``torch.cuda.is_bf16_supported()`` also says
  yes on a V100 or T4, where bf16 is emulated and far slower than fp16.)

The decision reads the device's properties (:class:`dprflow.hardware.DeviceInfo`), so the GPU
branch is tested on a CPU with a GPU's properties given as values.

Weights stay in float32; only the forward runs in the lower precision, and every result that
leaves a stage (embeddings, scores) is float32.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from dprflow import hardware
from dprflow.hardware import DeviceInfo

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_warned: set[tuple[str, str]] = set()


def resolve_precision(precision: str, device: str | torch.device | DeviceInfo) -> str:
    """The precision ``device`` runs for the setting ``precision``: ``"fp32"``, ``"bf16"`` or ``"fp16"``.

    ``device``: a device (its properties read from torch) or its :class:`DeviceInfo`. Raises
    ``ValueError`` for an unknown setting, and for ``bf16`` on a GPU that does not support it
    (use ``auto``, ``fp16`` or ``fp32`` there).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    info = device if isinstance(device, DeviceInfo) else hardware.device_info(device)
    if not info.is_cuda:
        if precision == "bf16" and info.bf16:
            return "bf16"
        if precision in ("bf16", "fp16") and (precision, info.type) not in _warned:
            _warned.add((precision, info.type))
            why = "no native bfloat16 (AVX512-BF16 or AMX)" if precision == "bf16" else "fp16 is for GPUs"
            log.warning("precision %s: the %s runs in fp32 (%s)", precision, info.type, why)
        return "fp32"
    if precision == "auto":
        return "bf16" if info.bf16 else "fp16"
    if precision == "bf16" and not info.bf16:
        raise ValueError(
            f"precision bf16: {info.name} (compute capability {info.capability[0]}.{info.capability[1]}) "
            "has no native bfloat16 (Ampere, 8.0, and later); set precision to auto, fp16 or fp32"
        )
    return precision


def autocast(resolved: str, device: str | torch.device) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for a resolved precision (:func:`resolve_precision`); a no-op for fp32."""
    if resolved not in DTYPES:
        raise ValueError(f"unresolved precision {resolved!r}; expected one of fp32, bf16, fp16")
    if resolved == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=DTYPES[resolved])
