"""How fast a training stage computes on its device: precision and the speed switches, apart from
the loop (as Hugging Face accelerate does).

- mixed precision (:mod:`dprflow.precision`): the autocast context and, for fp16, a loss scaler;
- the speed switches of the config's ``training`` section, each leaving the math unchanged up to
  float rounding (``tests/test_training_speed.py`` checks loss and gradients on the CPU):
  TF32 matrix products for fp32 on a GPU, the Transformers' attention kernel (SDPA by default),
  ``torch.compile`` of the Transformer layers, batches copied to the GPU without blocking the host;
- the seed of Python's, numpy's and torch's generators.

Every decision that differs on a GPU is a small function of the device's properties
(:class:`dprflow.hardware.DeviceInfo`: :func:`use_fused_adamw`, :func:`pin_memory`,
:func:`tf32_applies`, :func:`autocast_context`) or of where the tensors are (:func:`ddp_device_ids`,
:func:`rng_devices`), so ``tests/test_gpu_path.py`` runs each GPU branch on a CPU with a GPU's
properties given as values.

Padding-free batches (packed sequences, variable-length attention) are not adopted; docs/training.md
says what was tried with torch 2.14 and transformers 5.24 and what each gave.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from dprflow import hardware
from dprflow.hardware import AMPERE, DeviceInfo
from dprflow.models.packed import PACKED, Packing, set_packed
from dprflow.precision import autocast as precision_autocast
from dprflow.precision import resolve_precision

log = logging.getLogger(__name__)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Precision(NamedTuple):
    """The precision a training run computes in, its autocast context and its fp16 loss scaler."""

    resolved: str  # fp32, bf16 or fp16 (dprflow.precision.resolve_precision)
    autocast: Any  # the context of every forward
    scaler: torch.amp.GradScaler | None  # fp16 only: scales the loss so small gradients survive


def autocast_context(device: torch.device, precision: str, info: DeviceInfo | None = None) -> Precision:
    """The precision of the setting ``precision`` on a device of properties ``info`` (default:
    ``device``'s), with the autocast context and the loss scaler for the tensors' ``device``.

    The context and the scaler follow the tensors (``device.type``), the precision follows the
    properties: given a GPU's properties on a CPU, a test runs the bf16 or fp16 path (CPU
    autocast, a CPU loss scaler) that a GPU runs."""
    resolved = resolve_precision(precision, info or hardware.device_info(device))
    scaler = torch.amp.GradScaler(device.type) if resolved == "fp16" else None
    return Precision(resolved, precision_autocast(resolved, device), scaler)


def use_fused_adamw(info: DeviceInfo, wanted: bool) -> bool:
    """AdamW's fused kernel where it is asked for and the device is a GPU (the CPU keeps torch's
    default, as before)."""
    return wanted and info.is_cuda


def pin_memory(info: DeviceInfo) -> bool:
    """Page-locked host memory for the batches, so that their copies to a GPU do not block the host."""
    return info.is_cuda


# auto padding on a GPU: its bf16/fp16 tensor cores take matrix dimensions in multiples of 8.
GPU_PAD_MULTIPLE = 8


def pad_multiple(setting: str | int, info: DeviceInfo) -> int:
    """The multiple a batch's length is padded to (``training.pad_to_multiple_of``): a number as
    given (0 or 1: the longest sequence), or ``auto``: 8 on a GPU, none on a CPU (CPU runs keep
    their batches as they were)."""
    if str(setting) == "auto":
        return GPU_PAD_MULTIPLE if info.is_cuda else 0
    try:
        multiple = int(setting)
    except ValueError:
        multiple = -1
    if multiple < 0:
        raise ValueError(
            f"training.pad_to_multiple_of (--pad-to-multiple-of) is {setting!r}; set auto or an integer >= 0"
        )
    return multiple


def tf32_applies(info: DeviceInfo) -> bool:
    """TF32 tensor cores exist: an Ampere or later GPU."""
    return info.is_cuda and tuple(info.capability) >= AMPERE


def set_tf32(info: DeviceInfo, enabled: bool) -> None:
    """TF32 tensor cores for fp32 matrix products and convolutions on an Ampere or later GPU (10
    mantissa bits in the products, fp32 accumulation); nothing on a CPU or an older GPU.

    Through torch's legacy flags (``allow_tf32``): torch 2.14 raises when a legacy flag is read
    after the new ``fp32_precision`` API was set, and the legacy getters are what libraries read."""
    if tf32_applies(info):
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def ddp_device_ids(device: torch.device) -> list[int] | None:
    """DDP's ``device_ids``: the process's GPU, or ``None`` for a module on the CPU."""
    return [_index(device)] if device.type == "cuda" else None


def rng_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose random state a replayed forward (dropout) must save and restore:
    the one the model runs on, not every visible GPU (under torchrun each process sees all of a
    node's GPUs, and saving all of their states on every chunk costs for nothing)."""
    return [_index(device)] if device.type == "cuda" else []


def cuda_rng_state(device: torch.device) -> list[torch.Tensor] | None:
    """The random state of every visible GPU for a checkpoint when training on one, else ``None``."""
    return torch.cuda.get_rng_state_all() if device.type == "cuda" else None


def restore_cuda_rng(states: list[torch.Tensor] | None, device: torch.device) -> None:
    """Put back a checkpoint's GPU random states when training on a GPU, on the GPUs visible now
    (a node that shows fewer GPUs than the one that wrote the checkpoint restores those it has)."""
    if states is None or device.type != "cuda":
        return
    for index, state in enumerate(states[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(state.cpu(), index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


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


def set_attention(model: torch.nn.Module, attention: str) -> bool:
    """Every Transformer of ``model`` on the attention kernel ``attention`` (sdpa, eager,
    flash_attention_2); the same function, computed by another kernel. ``packed``: the models
    with a padding-free path (:mod:`dprflow.models.packed`: the retriever, the Condenser) take
    it, their padded calls and every other model sdpa. Returns whether some module runs packed
    (its batches then carry their packing, :func:`dprflow.training.batches.with_packing`)."""
    switched = []
    if attention == PACKED:
        switched = set_packed(model, True)
        log.info(
            "attention: %s", f"packed in {', '.join(switched)}" if switched else "sdpa (no packed path here)"
        )
        attention = "sdpa"
    for module in transformers_in(model):
        if module.config._attn_implementation != attention:
            module.set_attn_implementation(attention)
            log.info("attention of %s: %s", type(module).__name__, attention)
    return bool(switched)


def layers_in(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The Transformer layers in ``module`` (``BertLayer``, ``ElectraLayer``, ...: a module named
    ``*Layer`` with an ``attention`` block), inside its Hugging Face models and outside them
    (Condenser's head, an MAE's decoder)."""
    return [m for m in module.modules() if type(m).__name__.endswith("Layer") and hasattr(m, "attention")]


def compile_transformers(model: torch.nn.Module, **options: Any) -> int:
    """``torch.compile`` every Transformer layer of ``model`` in place (``nn.Module.compile``: the
    weights' names, hence checkpoints, are unchanged); returns how many.

    Per layer, not per model: the methods call their layers themselves (Condenser's backbone and
    head, an MAE's decoder), so a compiled model forward was never run for them, and the code
    around the layers (masks, pooling, losses) has Python branches on values. The layers of one
    class share one compiled graph (torch inlines the modules, their weights are inputs), and
    with ``dynamic=True`` its batch and length dimensions are symbolic from the first compile:
    one graph for every batch shape instead of a compile for the first shape and a recompile
    for the second (``bench/bench_gpu_feed.py`` counts them)."""
    layers = layers_in(model)
    for layer in layers:
        layer.compile(**{"dynamic": True, **options})
    log.info("torch.compile: %d Transformer layers; the first step compiles them", len(layers))
    return len(layers)


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (tensors nested in dicts, tuples, lists) on ``device``; copies from pinned memory
    do not block the host, so the next batch is built while this one is copied. A batch already
    there is returned as it is (the same object)."""
    if isinstance(batch, (torch.Tensor, Packing)):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        moved = {key: to_device(value, device) for key, value in batch.items()}
        if all(moved[key] is value for key, value in batch.items()):
            return batch
        return moved if type(batch) is dict else type(batch)(moved)
    if isinstance(batch, (tuple, list)):
        moved = [to_device(v, device) for v in batch]
        if all(a is b for a, b in zip(moved, batch, strict=True)):
            return batch
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch
