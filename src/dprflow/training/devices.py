"""Devices and precision of a training stage, apart from the loop (as Hugging Face accelerate does).

- mixed precision (:mod:`dprflow.precision`): the autocast context and, for fp16, a loss scaler;
- the speed switches of the config's ``training`` section, each leaving the math unchanged up to
  float rounding (``tests/test_training_speed.py`` checks loss and gradients on the CPU):
  TF32 matrix products for fp32 on a GPU, the Transformers' attention kernel (SDPA by default),
  ``torch.compile`` of the Transformers, batches copied to the GPU without blocking the host;
- the seed of Python's, numpy's and torch's generators.

Padding-free batches (sequences packed without padding, variable-length attention) are not
adopted: with torch 2.14 and transformers 5.23, BERT takes packed sequences only through
``flash_attention_2``, which needs the flash-attn package (not installable here, and GPU-only);
SDPA has no variable-length path for BERT, and nested (jagged) tensors do not go through
``BertModel``. docs/training.md says what was tried.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dprflow.precision import autocast as precision_autocast
from dprflow.precision import resolve_precision

log = logging.getLogger(__name__)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast_context(device: torch.device, precision: str):
    """The autocast context of the training forward and the fp16 loss scaler (``None`` unless fp16)."""
    resolved = resolve_precision(precision, device)
    scaler = torch.amp.GradScaler("cuda") if resolved == "fp16" else None
    return precision_autocast(resolved, device), scaler


def set_tf32(device: torch.device, enabled: bool) -> None:
    """TF32 tensor cores for fp32 matrix products and convolutions on an Ampere or later GPU (10
    mantissa bits in the products, fp32 accumulation); nothing on a CPU."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def transformers_in(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost Hugging Face models inside ``model`` (``model`` itself when it is one)."""
    from transformers import PreTrainedModel

    found: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        if isinstance(module, PreTrainedModel):
            found.append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return found


def set_attention(model: torch.nn.Module, attention: str) -> None:
    """Every Transformer of ``model`` on the attention kernel ``attention`` (sdpa, eager,
    flash_attention_2); the same function, computed by another kernel."""
    for module in transformers_in(model):
        if module.config._attn_implementation != attention:
            module.set_attn_implementation(attention)
            log.info("attention of %s: %s", type(module).__name__, attention)


def compile_transformers(model: torch.nn.Module, **options: Any) -> int:
    """``torch.compile`` the forward of every Transformer of ``model`` in place
    (``nn.Module.compile``: the weights' names, hence checkpoints, are unchanged); returns how many."""
    modules = transformers_in(model)
    for module in modules:
        module.compile(**options)
    log.info("torch.compile: %d Transformer(s); the first steps compile them", len(modules))
    return len(modules)


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (tensors nested in dicts, tuples, lists) on ``device``; copies from pinned memory
    do not block the host, so the next batch is built while this one is copied."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        moved = {key: to_device(value, device) for key, value in batch.items()}
        return moved if type(batch) is dict else type(batch)(moved)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
