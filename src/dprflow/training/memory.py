"""The peak memory of a training step, estimated before the step allocates it.

Every training stage (retrievers, reranker, and each pre-training method: Condenser, coCondenser,
Contriever, BMAE / CDMAE / CoT-MAE, the query-as-context variants) describes what one of its
steps holds at once as a :class:`StepMemory`; :func:`check_training_memory` compares the estimate
with what the job was given (the Snakemake rule's ``resources.mem_mb``, passed as ``--mem-mb``),
what the machine has (its RAM or cgroup limit; on a GPU, the device's memory) and stops with the
estimate, the figure it was compared with, and the config keys that change it. On a GPU the
estimate is only logged, with a warning when it is above the device's memory.

The estimate is an upper bound for a BERT-like encoder: the weights and AdamW's two moments (12
bytes per fp32 parameter trained, 4 per parameter held without gradient, such as MoCo's key
encoder), the gradients (4 bytes per parameter, made in the backward as the activations are
freed: the larger of the two counts, unless earlier micro-batches' gradients are held through the
forward), plus the activations a backward pass keeps, per Transformer layer and sequence of
``s`` tokens (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4.1, generalised to an intermediate size ``I``)::

    18 s h + 4 s I + 5 a s^2   bytes with 16-bit activations (twice that in fp32)

for hidden size ``h`` and ``a`` attention heads, every sequence taken at its maximum length (a
batch is padded to its longest); the ``5 a s^2`` of scores, softmax and dropout mask only where
the attention kernel keeps them (:func:`keeps_attention_scores`: not torch's fused SDPA kernels
on a GPU). That count takes every activation in 16 bits; under mixed precision (autocast: the
GPU's bf16 or fp16) a Hugging Face BERT layer keeps ``8 s h`` bytes more (:data:`AUTOCAST_LAYER_SH`:
the residual stream stays fp32), the step holds the weights' 16-bit copies
(:func:`autocast_weight_bytes`), and on a GPU the caching allocator counts cuBLAS's workspaces and
its own rounding (:data:`CUDA_ALLOCATED`). Without those three the estimate was 16-24% under
every step's peak on an H100; with them it is 1.04-1.19x (bench/RESULTS.md, 2026-11-26;
``tests/test_memory_estimates.py``). In fp32 (a CPU) none of them applies: there
``bench/bench_step_memory.py`` finds the estimate 1.05-1.22x the peak of real steps. With
gradient checkpointing a layer keeps only its input (``s h`` values) and one layer's activations
are rebuilt at a time. On top come the extra costs of each method: the layers a sequence runs
through besides the encoder (Condenser's head, an MAE's decoder), the MLM logits of the masked
tokens (``[M, V]``, kept with their fp32 log-softmax for the cross-entropy's backward, and their
gradient), tensors such as MoCo's queue or a gradient cache's representations, the gradients of
one layer's activations while the backward passes through it, and a fixed allowance for the
process itself.

A step's rows are those one process holds at once: a batch of ``B`` over ``W`` processes with
``k`` accumulation micro-batches holds ``B / W / k``; a gradient cache (``chunk_size``) holds the
activations of one chunk (plus every row's representation and its cached gradient).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dprflow import hardware
from dprflow.hardware import DeviceInfo
from dprflow.training.speed import layers_in, transformers_in

log = logging.getLogger(__name__)

# Python, torch, transformers, the tokenizer and the training data of a small run: a stage with
# all-MiniLM-L6-v2 loaded held 761 MB RSS before its first step, 106 MB of it the weights.
PROCESS_BYTES = 768 * 2**20
MB = 2**20
FP32 = 4
# What a CUDA process holds on its GPU besides its tensors: the context, the cuBLAS and cuDNN
# workspaces, and what the caching allocator keeps between blocks.
CUDA_RESERVED = 2**30
# What torch.cuda.max_memory_allocated (the peak bench/ compares with) counts on a GPU besides
# the step's tensors, added to the estimate on a GPU: the cuBLAS and cuBLASLt workspaces, which
# torch takes from its caching allocator (32 MiB each on Hopper, 4 before; a pair per thread that
# multiplies, the forward's and autograd's backward thread: 128 MiB), and the allocator's
# rounding: a cached block is handed out whole unless more than 1 MiB of it would be left, so a
# tensor above 1 MiB may count up to 1 MiB more, and a step holds hundreds. Calibrated on the
# H100 (bench/RESULTS.md, 2026-11-26): with the autocast terms below the tensors estimated were
# at most 55 MiB under the peaks, except with the gradient cache in chunks of 16 sequences: up to
# 325 MiB under. The same steps under bf16 autocast on a CPU (live tensors counted, the cache
# included) peak within 2% of the tensors estimated, so that is the allocator's, likeliest its
# rounding as the cache's many chunks recycle blocks (bench_train_throughput.py prints the GPU's
# "requested" peak, the tensors' own bytes, beside the allocated one to tell). 512 MiB leaves the
# smallest step measured 7% above its peak.
CUDA_ALLOCATED = 512 * MB
# Bytes per token and hidden unit that one BERT layer keeps under autocast beyond Korthikanti's
# 16-bit count (18 s h + 4 s I). Autocast changes what is saved for the backward in two places:
# - the layer's input is fp32 (the residual stream: LayerNorm runs in fp32 under autocast) and
#   is cast to 16 bits by each of the query, key and value projections, a copy each (autocast
#   caches the casts of weights, not of activations): 3 x 2 s h saved where the count has 2 s h;
# - the two LayerNorms keep their fp32 inputs (the residual sums): 2 x 4 s h where it has 4 s h.
# The rest is as counted: q, k, v (6 s h) and the attention's output (2 s h, the output
# projection's input: the fused kernels return it already laid out, no copy) kept by SDPA, two
# dropout masks of one byte (2 s h), the feed-forward's 16-bit input cast (2 s h), its
# intermediate before and after GELU (4 s I). Total 26 s h + 4 s I bytes a layer. Calibrated on
# the H100 (bench/RESULTS.md, 2026-11-26): the bare BertModel's peak grew by 49.7 MiB a sequence
# of 128 tokens from 64 to 512 sequences; 12 x (26 s h + 4 s I) is 47.3 MiB, the rest the
# embeddings' fp32 LayerNorm input and the backward's passing gradients; the 16-bit count,
# 12 x (18 s h + 4 s I) = 38.3 MiB, was 23% short. A BERT layer under bf16 autocast on a CPU saves
# the same for its backward (saved_tensors_hooks: three (s, h) bf16 casts of its input, two fp32
# LayerNorm inputs).
AUTOCAST_LAYER_SH = 8
# Under autocast softmax runs in fp32: the eager kernel keeps the softmax's fp32 output (4 a s^2),
# the dropout mask (a s^2) and the dropped-out probabilities cast to 16 bits for the product with
# V (2 a s^2): 7 a s^2 bytes where the 16-bit count has 5 (not measured: the GPU check runs SDPA).
AUTOCAST_SCORES = 7


@dataclass(frozen=True)
class EncoderShape:
    """The sizes of a Transformer encoder the estimate needs (no weights)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    params: int  # the encoder's parameters, embeddings included

    @property
    def layer_params(self) -> int:
        """Parameters of one Transformer layer (attention, feed-forward, two LayerNorms)."""
        h, inner = self.hidden_size, self.intermediate_size
        return 4 * h * h + 2 * h * inner + 9 * h + inner

    @property
    def mlm_head_params(self) -> int:
        """BERT's MLM head without its decoder weight (tied to the embeddings): transform, bias."""
        return self.hidden_size * self.hidden_size + 3 * self.hidden_size + self.vocab_size

    @classmethod
    def of(cls, model_or_config: Any) -> EncoderShape:
        """From a model holding a Hugging Face encoder (its parameters counted) or from a config
        (the encoder built on the meta device to count them: no memory, no weights read)."""
        if isinstance(model_or_config, torch.nn.Module):
            config = encoder_config(model_or_config)
            params = sum(p.numel() for p in model_or_config.parameters())
        else:
            from transformers import AutoModel

            config = model_or_config
            with torch.device("meta"):
                params = sum(p.numel() for p in AutoModel.from_config(config).parameters())
        h = config.hidden_size
        return cls(
            h,
            config.num_hidden_layers,
            config.num_attention_heads,
            getattr(config, "intermediate_size", 4 * h),
            getattr(config, "vocab_size", 0),
            params,
        )


def encoder_shape(init: str) -> EncoderShape:
    """The shape of the encoder a stage starts from (``model.init``, a packaged name, a saved
    model folder or a hub id), read from its ``config.json`` only."""
    from transformers import AutoConfig

    from dprflow.models.init import resolve_model

    return EncoderShape.of(AutoConfig.from_pretrained(resolve_model(init)))


def encoder_config(model: torch.nn.Module) -> Any:
    """The Hugging Face config of the (first) Transformer inside ``model``."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "hidden_size") and hasattr(config, "num_hidden_layers"):
            return config
    raise ValueError(f"{type(model).__name__} holds no Transformer with a Hugging Face config")


@dataclass(frozen=True)
class StepMemory:
    """What one training step of one process holds at its peak."""

    # (rows, tokens) run through the whole encoder with a graph, at once
    sequences: tuple[tuple[int, int], ...]
    # (rows, tokens, layers) run with a graph through layers besides the encoder (Condenser head,
    # MAE decoder)
    extra_layers: tuple[tuple[int, int, int], ...] = ()
    masked_tokens: int = 0  # MLM targets scored against the vocabulary ([M, V] logits), all MLM losses
    extra_params: int = 0  # trained parameters besides the encoder's (head, decoder, projection)
    frozen_params: int = 0  # parameters held without gradient or optimizer state (MoCo key encoder)
    buffer_bytes: int = 0  # other tensors kept through the step (MoCo queue, cached representations)
    checkpointing: bool = False  # gradient checkpointing in the encoder
    # the weights' gradients of an earlier micro-batch or chunk are held through this one's
    # forward (gradient accumulation, a gradient cache, sub-batches: :func:`holds_gradients`)
    accumulates: bool = False

    def describe(self) -> str:
        parts = [f"{n} sequences of {length} tokens" for n, length in self.sequences]
        parts += [f"{n} x {length} tokens through {k} more layers" for n, length, k in self.extra_layers]
        if self.masked_tokens:
            parts.append(f"{self.masked_tokens} masked tokens' logits")
        if self.frozen_params:
            parts.append(f"{self.frozen_params} frozen parameters")
        if self.buffer_bytes:
            parts.append(f"{self.buffer_bytes // MB} MB of buffers")
        return " + ".join(parts)


def per_process(rows: int, world: int = 1, accumulation: int = 1, chunk: int = 0) -> int:
    """Rows one process runs through the model at once: its share of ``rows``, one micro-batch
    of it, and at most one gradient-cache chunk (``chunk`` 0: no cache)."""
    local = -(-rows // max(1, world))
    local = -(-local // max(1, accumulation))
    return min(local, chunk) if chunk else local


def holds_gradients(accumulation: int, rows: int, chunk: int = 0) -> bool:
    """Whether a step's gradients are held through a forward: with ``accumulation`` micro-batches
    or a ``chunk`` smaller than the ``rows`` one process runs (gradient cache, sub-batches), the
    first micro-batch's or chunk's backward fills them before the next forward."""
    return accumulation > 1 or 0 < chunk < rows


def contrastive_cache_bytes(rows: int, columns: int, hidden_size: int) -> int:
    """A contrastive loss over ``rows x columns`` scores of ``hidden_size`` representations: the
    representations and their (cached) gradients, and the scores with their softmax and gradient,
    in fp32."""
    return FP32 * (2 * (rows + columns) * hidden_size + 3 * rows * columns)


def activation_bytes(
    shape: EncoderShape, length: int, bytes_per_value: int, layers: int | None = None, scores: bool = True
) -> int:
    """Activations one sequence of ``length`` tokens keeps for the backward pass in ``layers``
    layers shaped like the encoder's (all of the encoder's by default). ``scores``: the attention
    kernel keeps the ``a x s x s`` scores, softmax and dropout mask (``5 a s^2``); without, a fused
    kernel keeps one fp32 log-sum-exp per head and token (:func:`keeps_attention_scores`).
    ``bytes_per_value`` 2: 16-bit activations under autocast, with what autocast keeps besides
    (:data:`AUTOCAST_LAYER_SH`, :data:`AUTOCAST_SCORES`); 4: fp32, twice the 16-bit count."""
    h, a, inner = shape.hidden_size, shape.num_attention_heads, shape.intermediate_size
    attention = 5 * a * length * length if scores else 2 * a * length
    per_layer = (18 * length * h + 4 * length * inner + attention) * bytes_per_value // 2
    if bytes_per_value == 2:  # mixed precision: what autocast keeps besides (AUTOCAST_LAYER_SH)
        per_layer += AUTOCAST_LAYER_SH * length * h
        per_layer += (AUTOCAST_SCORES - 5) * a * length * length if scores else 2 * a * length
    n_layers = shape.num_hidden_layers if layers is None else layers
    return n_layers * per_layer


def keeps_attention_scores(attention: str, cuda: bool) -> bool:
    """Whether attention keeps its ``s x s`` scores for the backward: the eager kernel does; on a
    GPU torch's fused SDPA kernels (flash, memory-efficient: BERT's padding mask takes the
    latter) and flash-attn keep a log-sum-exp per head and token instead; on a CPU SDPA with a
    padding mask runs the math path, which keeps them (bench/bench_step_memory.py: the estimate
    with them is 1.0-1.3x the measured peak at 128 and 512 tokens)."""
    return attention == "eager" or not cuda


def transformer_layers(model: torch.nn.Module) -> int:
    """Transformer layers one sequence runs through with a graph in ``model``: the layers of its
    largest Hugging Face encoder (one tower at a time: a bi-encoder's query or passage tower,
    Contriever's query encoder; MoCo's key encoder runs without a graph) plus those outside any
    (Condenser's head, an MAE's decoder)."""
    towers = [len(layers_in(t)) for t in transformers_in(model)]
    return max(towers, default=0) + len(layers_in(model)) - sum(towers)


def row_activation_bytes(
    model: torch.nn.Module, length: int, bytes_per_value: int, masked: int = 0, scores: bool = True
) -> int:
    """Bytes one sequence of ``length`` tokens with ``masked`` MLM targets adds to a step of
    ``model``: its activations in every layer it runs through with a graph
    (:func:`transformer_layers`), the gradients of one layer's activations in the backward, and
    its masked tokens' logits with their fp32 log-softmax and gradient (as :func:`estimate_step_bytes`)."""
    config = encoder_config(model)
    layers = transformer_layers(model) + 1
    logits = masked * getattr(config, "vocab_size", 0) * (bytes_per_value + 2 * FP32)
    return activation_bytes(config, length, bytes_per_value, layers=layers, scores=scores) + logits


def as_step(step: StepMemory | Sequence[tuple[int, int]]) -> StepMemory:
    if isinstance(step, StepMemory):
        return step
    return StepMemory(tuple((int(n), int(length)) for n, length in step))


def estimate_step_bytes(
    model: torch.nn.Module | EncoderShape,
    step: StepMemory | Sequence[tuple[int, int]],
    bytes_per_value: int = 4,
    scores: bool = True,
    cuda: bool = False,
) -> int:
    """Peak bytes of one optimizer step of ``model`` (a model holding a Hugging Face encoder, or
    its :class:`EncoderShape`). ``step``: a :class:`StepMemory`, or a list of (sequences, tokens
    each) fed through the encoder at once. ``scores``: the attention kernel keeps its ``s x s``
    scores (:func:`keeps_attention_scores`). ``cuda``: on a GPU, with what its allocator counts
    besides the tensors (:data:`CUDA_ALLOCATED`)."""
    shape = model if isinstance(model, EncoderShape) else EncoderShape.of(model)
    step = as_step(step)

    def one(length: int, layers: int | None = None) -> int:
        return activation_bytes(shape, length, bytes_per_value, layers=layers, scores=scores)

    acts = 0
    # The backward of a layer holds the gradients of its activations beside everything saved:
    # one layer's worth for the largest group of rows (and one rebuilt layer with checkpointing).
    layer = max(
        [n * one(length, 1) for n, length in step.sequences]
        + [n * one(length, 1) for n, length, _ in step.extra_layers],
        default=0,  # no sequence: the weights and the process alone
    )
    acts += layer * (2 if step.checkpointing else 1)
    for n, length in step.sequences:
        if step.checkpointing:  # each layer's input kept, one layer rebuilt at a time
            acts += n * shape.num_hidden_layers * length * shape.hidden_size * bytes_per_value
        else:
            acts += n * one(length)
    for n, length, layers in step.extra_layers:
        acts += n * one(length, layers)
    # The logits in the forward's precision, their log-softmax in fp32 (cross-entropy autocasts),
    # and in the backward the logits' fp32 gradient.
    acts += step.masked_tokens * shape.vocab_size * (bytes_per_value + 2 * FP32)
    trained = shape.params + step.extra_params
    # A trained weight and AdamW's two moments are held throughout (12 bytes). Its gradient (4
    # bytes; the trainer sets them to None after each step) appears in the backward as the
    # activations are freed, layer by layer: the peak is the larger of the two, plus the tied MLM
    # decoder's (the embeddings') gradient, the first one made; both add up only where an earlier
    # micro-batch's or chunk's gradients are held through the forward (``step.accumulates``).
    grads = FP32 * trained
    if step.accumulates:
        dynamic = acts + grads
    else:
        first = FP32 * shape.vocab_size * shape.hidden_size if step.masked_tokens else 0
        dynamic = max(acts + first, grads)
    held = 12 * trained + FP32 * step.frozen_params + step.buffer_bytes
    held += autocast_weight_bytes(trained, bytes_per_value) + (CUDA_ALLOCATED if cuda else 0)
    return PROCESS_BYTES + held + dynamic


def autocast_weight_bytes(trained: int, bytes_per_value: int) -> int:
    """The 16-bit copies of ``trained`` weights under mixed precision (``bytes_per_value`` 2):
    autocast casts each weight once and keeps the copy to the end of the autocast block (the
    Trainer's and the benchmark's backward runs inside it), and each layer's backward needs it:
    2 bytes a weight through the whole step. 0 in fp32."""
    return 2 * trained if bytes_per_value == 2 else 0


def model_state_bytes(model: torch.nn.Module) -> int:
    """Bytes ``model``'s weights hold through an AdamW step: 16 per trained fp32 parameter (the
    weight, its gradient, the two moments), 4 per parameter held without gradient (MoCo's key
    encoder), and its buffers (MoCo's queue)."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return 16 * trained + FP32 * frozen + buffers


def gradient_cache_budget(info: DeviceInfo, model: torch.nn.Module, fraction: float = 0.9) -> int | None:
    """Bytes one gradient-cache chunk's activations may take on a device of properties ``info``
    (``training.chunk_from_memory``): ``fraction`` of a GPU's memory less the model's state
    (:func:`model_state_bytes`) and what CUDA holds itself (:data:`CUDA_RESERVED`), at least 0;
    ``None`` on a CPU, where the configured ``chunk_size`` stays."""
    if not info.is_cuda or info.total_memory <= 0:
        return None
    return max(0, int(fraction * info.total_memory) - model_state_bytes(model) - CUDA_RESERVED)


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


def world_size() -> int:
    """Processes sharing a batch (torchrun's ``WORLD_SIZE``; 1 without torchrun)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def bytes_per_value(precision: str, cuda: bool) -> int:
    """Bytes of one activation: 16-bit under mixed precision on a GPU, else fp32."""
    return 2 if cuda and precision != "fp32" else FP32


def masked_per_row(probability: float, tokens: int) -> int:
    """MLM targets of a row of ``tokens`` maskable tokens (:mod:`dprflow.pretraining.masking`
    selects ``max(1, round(p n))``; whole-word masking a few more)."""
    return max(1, math.ceil(probability * tokens))


def memory_message(
    estimate: int, step: StepMemory, limit: int, what: str, keys: Sequence[str], chunk_key: str | None = None
) -> str:
    """The message of a step above a limit: the estimate, what it is made of, the limit and the
    config keys that lower it (``chunk_key``: the stage's exact sub-batching, named first)."""
    fixes = (
        [f"set or lower {chunk_key} (the same gradient, one chunk in memory at a time)"] if chunk_key else []
    )
    fixes.append(f"lower {', '.join(keys)}")
    if not step.checkpointing:
        fixes.append("set training.gradient_checkpointing (the same gradient, about a third slower)")
    return (
        f"a training step needs about {estimate // MB} MB (estimated from {step.describe()} per "
        f"process) but {what} is {limit // MB} MB; {', or '.join(fixes)}, or give the job more memory"
    )


def memory_limits(info: DeviceInfo, mem_mb: int, machine: int | None) -> list[tuple[int, str]]:
    """What a step's estimate is compared with, as (bytes, what): a GPU's memory on a GPU; on a
    CPU the job's memory (``mem_mb``, 0: not given) and the machine's (``machine``, None: unknown)."""
    if info.is_cuda:
        return [(info.total_memory, "the GPU's memory")]
    limits = [(mem_mb * MB, "the job's memory (resources.mem_mb, --mem-mb)")] if mem_mb else []
    return limits + ([(machine, "this machine's memory")] if machine else [])


def check_training_memory(
    model: torch.nn.Module | EncoderShape,
    step: StepMemory | Sequence[tuple[int, int]],
    mem_mb: int,
    keys: Sequence[str],
    precision: str = "auto",
    chunk_key: str | None = None,
    info: DeviceInfo | None = None,
    attention: str = "sdpa",
) -> int:
    """Stop (``ValueError``) when the estimated peak of a step is above what the job was given
    (``mem_mb``, 0: not given) or what the machine has; return the estimate in bytes. On a GPU
    (``info``, default: this process's device) the estimate is compared with the GPU's memory and
    only logged, with a warning when above (module docstring). ``attention``: the kernel
    (``training.attention``; whether it keeps the attention scores, :func:`keeps_attention_scores`).

    A plain list of (sequences, tokens) is the whole batch and is shared among the processes
    here; a :class:`StepMemory` already holds one process's rows (:func:`per_process`)."""
    if not isinstance(step, StepMemory):
        step = StepMemory(tuple((per_process(n, world_size()), length) for n, length in step))
    info = info or hardware.device_info()
    cuda = info.is_cuda
    scores = keeps_attention_scores(attention, cuda)
    estimate = estimate_step_bytes(model, step, bytes_per_value(precision, cuda), scores, cuda)
    limits = memory_limits(info, mem_mb, None if cuda else machine_bytes())
    log.info(
        "estimated peak memory of a training step: %d MB (%s)",
        estimate // MB,
        ", ".join(f"{what}: {limit // MB} MB" for limit, what in limits) or "no limit known",
    )
    for limit, what in limits:
        if estimate > limit:
            message = memory_message(estimate, step, limit, what, keys, chunk_key)
            if cuda:
                log.warning("%s (an upper bound on a GPU: training goes on)", message)
                break
            raise ValueError(message)
    return estimate
