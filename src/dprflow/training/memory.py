"""The peak memory of a training step, estimated before the step allocates it.

A group-trained stage feeds ``batch_size x group_size`` passages (and ``batch_size`` queries)
through a Transformer at once; a group or batch set too large used to grow until the operating
system killed the job, with no error line. :func:`check_training_memory` compares an estimate
with what the job was given (the Snakemake rule's ``resources.mem_mb``, passed as ``--mem-mb``),
what the machine has (its RAM or cgroup limit; on a GPU, the device's memory) and stops with the
estimate, the figure it was compared with, and the config keys that change it. On a GPU the
estimate is only logged, with a warning when it is above the device's memory: fused attention
kernels keep no ``s x s`` scores there, so the bound below can be far above the real peak.

The estimate is an upper bound for a BERT-like encoder: parameters with their gradients and the
two AdamW moments (16 bytes per fp32 parameter) plus the activations a backward pass keeps, per
layer and sequence of ``s`` tokens (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", section 4.1, generalised to an intermediate size ``I``)::

    18 s h + 4 s I + 5 a s^2   bytes with 16-bit activations (twice that in fp32)

for hidden size ``h`` and ``a`` attention heads, every sequence taken at its maximum length (a
batch is padded to its longest), plus a fixed allowance for the process itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# Python, torch, the tokenizer and the training data of a small run.
PROCESS_BYTES = 512 * 2**20
MB = 2**20


def encoder_config(model: torch.nn.Module) -> Any:
    """The Hugging Face config of the (first) Transformer inside ``model``."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "hidden_size") and hasattr(config, "num_hidden_layers"):
            return config
    raise ValueError(f"{type(model).__name__} holds no Transformer with a Hugging Face config")


def activation_bytes(config: Any, length: int, bytes_per_value: int) -> int:
    """Activations one sequence of ``length`` tokens keeps for the backward pass, all layers."""
    h, a = config.hidden_size, config.num_attention_heads
    inner = getattr(config, "intermediate_size", 4 * h)
    per_layer_16bit = 18 * length * h + 4 * length * inner + 5 * a * length * length
    return config.num_hidden_layers * per_layer_16bit * bytes_per_value // 2


def estimate_step_bytes(
    model: torch.nn.Module, shapes: Sequence[tuple[int, int]], bytes_per_value: int = 4
) -> int:
    """Peak bytes of one optimizer step: ``shapes`` lists (sequences, tokens each) fed per step."""
    config = encoder_config(model)
    params = sum(p.numel() for p in model.parameters())
    acts = sum(n * activation_bytes(config, length, bytes_per_value) for n, length in shapes)
    return PROCESS_BYTES + 16 * params + acts


def machine_bytes() -> int | None:
    """The memory this process may use: physical RAM, or a smaller cgroup limit."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (total or 2**62):
            total = int(text)
    return total


def check_training_memory(
    model: torch.nn.Module,
    shapes: Sequence[tuple[int, int]],
    mem_mb: int,
    keys: Sequence[str],
    precision: str = "auto",
) -> int:
    """Stop (``ValueError``) when the estimated peak of a step is above what the job was given
    (``mem_mb``, 0: not given) or what the machine or GPU has; return the estimate in bytes."""
    # Under torchrun each process holds its share of the batch.
    world = max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    shapes = [(-(-n // world), length) for n, length in shapes]
    cuda = torch.cuda.is_available()
    estimate = estimate_step_bytes(model, shapes, 2 if cuda and precision != "fp32" else 4)
    limits = []
    if cuda:
        device = torch.cuda.current_device()
        limits.append((torch.cuda.get_device_properties(device).total_memory, "the GPU's memory"))
    else:
        if mem_mb:
            limits.append((mem_mb * MB, "the job's memory (resources.mem_mb, --mem-mb)"))
        machine = machine_bytes()
        if machine:
            limits.append((machine, "this machine's memory"))
    log.info(
        "estimated peak memory of a training step: %d MB (%s)",
        estimate // MB,
        ", ".join(f"{what}: {limit // MB} MB" for limit, what in limits) or "no limit known",
    )
    for limit, what in limits:
        if estimate > limit:
            message = (
                f"a training step needs about {estimate // MB} MB (estimated from "
                f"{' + '.join(f'{n} sequences of {length} tokens' for n, length in shapes)} per process) "
                f"but {what} is {limit // MB} MB; lower {', '.join(keys)}, or give the job more memory"
            )
            if cuda:
                log.warning("%s (an upper bound on a GPU: training goes on)", message)
                break
            raise ValueError(message)
    return estimate
