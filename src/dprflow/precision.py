"""Numeric precision of training and inference: one setting, resolved per device.

The config's ``precision`` (``auto``, ``bf16``, ``fp16``, ``fp32``) reaches every stage that runs
a model: the training stages (mixed precision with ``torch.autocast``; fp16 with a loss scaler)
and the inference stages (corpus encoding, query encoding in dense search, reranking, teacher
scoring, doc2query generation). :func:`resolve_precision` turns the setting into what a device
runs:

- on a CPU everything runs in fp32 (today's CPU numbers; a bf16/fp16 request is logged once);
- on a GPU, ``auto`` is bf16 where the GPU supports it (``torch.cuda.is_bf16_supported()``:
  Ampere and later) and fp16 elsewhere; ``bf16`` on a GPU without it is an error, not a silent
  fallback.

Weights stay in float32; only the forward runs in the lower precision, and every result that
leaves a stage (embeddings, scores) is float32.
"""

from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_warned: set[tuple[str, str]] = set()


def resolve_precision(precision: str, device: str | torch.device) -> str:
    """The precision ``device`` runs for the setting ``precision``: ``"fp32"``, ``"bf16"`` or ``"fp16"``.

    Raises ``ValueError`` for an unknown setting, and for ``bf16`` on a GPU that does not
    support it (use ``auto``, ``fp16`` or ``fp32`` there).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    device = torch.device(device)
    if device.type != "cuda":
        if precision in ("bf16", "fp16") and (precision, device.type) not in _warned:
            _warned.add((precision, device.type))
            log.warning(
                "precision %s: the %s runs in fp32 (mixed precision is for GPUs)", precision, device.type
            )
        return "fp32"
    bf16_ok = torch.cuda.is_bf16_supported()
    if precision == "auto":
        return "bf16" if bf16_ok else "fp16"
    if precision == "bf16" and not bf16_ok:
        raise ValueError(
            f"precision bf16: {torch.cuda.get_device_name(device)} does not support bfloat16; "
            "set precision to auto, fp16 or fp32"
        )
    return precision


def autocast(resolved: str, device: str | torch.device) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for a resolved precision (:func:`resolve_precision`); a no-op for fp32."""
    if resolved not in DTYPES:
        raise ValueError(f"unresolved precision {resolved!r}; expected one of fp32, bf16, fp16")
    if resolved == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=DTYPES[resolved])
