"""How the pre-training losses are stepped: the machinery that calls a model's own loss.

A model module holds its model and its loss as the paper writes it; this module decides how a
batch is back-propagated: whole, or in chunks with a gradient cache (coCondenser §3.3, eq. 9-12),
and how processes share the batch: the contrastive loss of eq. 6 ranges over the spans of every
process (gathered with :func:`dprflow.training.distributed.gather_with_grad`), and the MLM part is
weighted so that DDP's average of the processes' gradients is the gradient of the global token
mean (eq. 7). With one process every helper is the identity and nothing changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn

from dprflow.pretraining.condenser.model import (
    CoCondenserOutput,
    cocondenser_contrastive_loss,
    cocondenser_loss,
    unwrap,
)
from dprflow.pretraining.masking import IGNORE_INDEX
from dprflow.training import distributed
from dprflow.training.gradcache import ChunkLoss, gradcache_step, split_batch
from dprflow.training.memory import (
    encoder_config,
    keeps_attention_scores,
    masked_per_row,
    row_activation_bytes,
)

log = logging.getLogger(__name__)

# Bytes one gradient-cache chunk's activations may take (the Trainer sets it with
# training.chunk_from_memory on a GPU); None: the configured chunk_size as it is.
_CHUNK_BUDGET: contextvars.ContextVar[int | None] = contextvars.ContextVar("chunk_budget", default=None)
_told_chunks: set[tuple[int, int]] = set()


@contextlib.contextmanager
def chunk_budget(budget: int | None) -> Iterator[None]:
    """Within the block, gradient caches choose their chunk from ``budget`` bytes (:func:`fitting_chunk`)."""
    token = _CHUNK_BUDGET.set(budget)
    try:
        yield
    finally:
        _CHUNK_BUDGET.reset(token)


def fitting_chunk(model: nn.Module, chunk_size: int, length: int, rows: int, masked: int = 0) -> int:
    """The chunk a gradient cache encodes: ``chunk_size``, or with a budget (:func:`chunk_budget`)
    the largest number of sequences of ``length`` tokens (``masked`` MLM targets each) whose
    activations fit in it (:func:`dprflow.training.memory.row_activation_bytes`: every
    Transformer layer the chunk's forward runs, the backward's gradients of one layer, the
    masked tokens' logits; 16-bit under autocast), at least ``chunk_size`` and at most ``rows``.
    The cache's gradient is the same for any chunk size (to float rounding); a larger chunk runs
    fewer, fuller kernels, so the cache costs its second forward and little more."""
    budget = _CHUNK_BUDGET.get()
    if not chunk_size or budget is None:
        return chunk_size
    device_type = next(model.parameters()).device.type
    half = torch.is_autocast_enabled(device_type)
    kernel = getattr(encoder_config(model), "_attn_implementation", None) or "sdpa"
    scores = keeps_attention_scores(kernel, device_type == "cuda")
    per_row = row_activation_bytes(model, length, 2 if half else 4, masked, scores)
    chosen = min(rows, max(chunk_size, budget // max(per_row, 1)))
    if (chunk_size, chosen) not in _told_chunks:
        _told_chunks.add((chunk_size, chosen))
        log.info(
            "gradient cache: chunks of %d (chunk_size %d; the largest that fits the memory)",
            chosen,
            chunk_size,
        )
    return chosen


def masked_count(labels: torch.Tensor) -> torch.Tensor:
    """Masked tokens (MLM targets) in ``labels``: a 0-dim tensor on their device (reading it as a
    number would make the host wait for the GPU; the weights below stay tensors)."""
    return (labels != IGNORE_INDEX).sum()


def global_masked_count(local: torch.Tensor) -> torch.Tensor:
    """The masked tokens of all processes' batches (``local`` with one process), a tensor."""
    if not distributed.is_distributed():
        return local
    total = local.detach().clone().reshape(1)
    torch.distributed.all_reduce(total)
    return total.reshape(())


def share(count: torch.Tensor | int, total: torch.Tensor | int) -> torch.Tensor | float:
    """``count / max(total, 1)``, for counts given as numbers or as tensors (no host sync; in
    float64, as Python divides numbers)."""
    if isinstance(total, torch.Tensor):
        return torch.as_tensor(count, dtype=torch.float64) / total.clamp(min=1).double()
    return count / max(total, 1)


def cocondenser_step(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    chunk_size: int,
    backward_fn: Callable[[torch.Tensor], None],
) -> CoCondenserOutput:
    """Back-propagate the coCondenser loss (eq. 7) of ``batch``: whole, or with a gradient cache in
    chunks of ``chunk_size`` spans when the batch holds more (0: always whole). Same gradients
    either way; returns the loss terms detached, for logging.

    Across processes (``torchrun``) ``batch`` is this process's share: eq. 6 ranges over the
    global batch (:func:`cocondenser_contrastive_loss` with ``gather_with_grad``), and the MLM
    loss is weighted by ``world * local masked / global masked`` so that the DDP-averaged
    gradient equals one process's on the global batch (``tests/test_distributed.py``)."""
    if chunk_size and chunk_size < len(batch["input_ids"]):
        return cocondenser_gradcache_step(model, batch, chunk_size, backward_fn=backward_fn)
    world = distributed.get_world_size()
    weight = 1.0
    if world > 1:
        local = masked_count(batch["labels"])
        weight = world * share(local, global_masked_count(local))
    out = cocondenser_loss(
        model, batch, distributed.gather_with_grad, distributed.get_rank(), mlm_weight=weight
    )
    backward_fn(out.loss)
    return CoCondenserOutput(*(v.detach() for v in out))


def cocondenser_gradcache_step(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    chunk_size: int,
    backward_fn: Callable[[torch.Tensor], None] | None = None,
) -> CoCondenserOutput:
    """Back-propagate the loss of :func:`cocondenser_loss` in chunks with a gradient cache (coCondenser §3.3).

    The gradients accumulated in ``.grad`` equal those of ``cocondenser_loss(model,
    batch).loss.backward()`` (with dropout, for the same dropout masks; eq. 12), with the memory
    of one chunk. The MLM loss of chunk ``c`` is weighted by its share of the batch's masked
    tokens, so that the sum is the batch's token mean. Returns detached values for logging; the
    caller must not call ``.backward()`` on them.

    Across processes the cached gradient ``v = dL_co / dh`` is that of the global eq. 6 (the
    representations of every process are gathered inside the loss, whose backward sums the
    processes' gradients), and a chunk's MLM weight is ``world * its masked tokens / the global
    masked tokens``: after DDP's average, the gradient of one process on the global batch.

    Args:
        model: a :class:`Condenser` (or its DDP wrapper).
        batch: as in :func:`cocondenser_loss`; any number of rows ``2n``.
        chunk_size: spans per sub-batch; the last chunk holds the remainder.
        backward_fn: see :func:`dprflow.training.gradcache.gradcache_step` (fp16 grad scaling).
    """
    core = unwrap(model)
    rows, length = batch["input_ids"].shape
    masked = masked_per_row(core.config.mlm_probability, length)
    chunks = split_batch(batch, fitting_chunk(model, chunk_size, length, rows, masked))
    counts = [masked_count(c["labels"]) for c in chunks]  # masked tokens per chunk (tensors)
    total = global_masked_count(sum(counts))
    world, rank = distributed.get_world_size(), distributed.get_rank()

    def rep_fn(m: nn.Module, chunk: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return core.encode(chunk["input_ids"], chunk["attention_mask"], chunk.get("token_type_ids"))

    def chunk_loss_fn(m: nn.Module, chunk: Mapping[str, torch.Tensor]) -> ChunkLoss:
        out = m(**chunk)  # the backbone runs first: same dropout masks as rep_fn
        return ChunkLoss(out.cls, out.loss, {"head_mlm": out.head_mlm, "backbone_mlm": out.backbone_mlm})

    result = gradcache_step(
        model,
        chunks,
        rep_fn,
        lambda reps: cocondenser_contrastive_loss(
            reps, core.config.temperature, distributed.gather_with_grad, rank
        ),
        chunk_loss_fn,
        chunk_weights=[share(c, total) if world == 1 else world * share(c, total) for c in counts],
        backward_fn=backward_fn,
    )
    return CoCondenserOutput(
        result.loss, result.cached_loss, result.parts["head_mlm"], result.parts["backbone_mlm"]
    )


def biencoder_step(
    model: nn.Module,
    query_inputs: Mapping[str, torch.Tensor],
    passage_inputs: Mapping[str, torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | Mapping[str, torch.Tensor]],
    chunk_size: int,
    backward_fn: Callable[[torch.Tensor], None],
) -> dict[str, torch.Tensor]:
    """Back-propagate a bi-encoder's fine-tuning loss ``loss_fn(q [B, H], p [B * G, H])``: whole, or
    with a gradient cache in chunks of ``chunk_size`` queries and ``chunk_size`` passages when
    either side holds more (0: always whole).

    The loss couples the batch (in-batch negatives: every query is scored against every passage,
    coCondenser eq. 14, CDMAE eq. 10-11), so the cache computes all the embeddings without a
    graph first, the loss and its gradient with respect to them (the cache), then re-encodes
    each chunk with a graph and back-propagates ``<embedding, cached gradient>`` (Gao et al.,
    2021; coCondenser §3.3 eq. 9-12, here without a local loss). The gradient equals the full
    batch's (dropout included: each chunk's forward is replayed with its random state), with the
    activations of one chunk in memory: the papers' fine-tuning batches (64 queries x groups of
    32 passages) fit one GPU.

    ``loss_fn`` returns a scalar, or a mapping with ``loss`` (back-propagated) and other terms to
    log. Returns the detached values for logging (``loss`` first).

    Limits: with several processes, ``loss_fn`` gathers the passages itself (as the whole-batch
    path does); separate query and passage towers under DDP need the whole-batch path (a chunk
    of one side leaves the other tower's weights unused in its forward).
    """
    n_queries = len(query_inputs["input_ids"])
    n_passages = len(passage_inputs["input_ids"])
    length = max(query_inputs["input_ids"].shape[1], passage_inputs["input_ids"].shape[1])
    chunk_size = fitting_chunk(model, chunk_size, length, max(n_queries, n_passages))
    if not chunk_size or (chunk_size >= n_queries and chunk_size >= n_passages):
        q, p = model(query_inputs, passage_inputs)
        out = _as_loss_dict(loss_fn(q, p))
        backward_fn(out["loss"])
        return {name: value.detach() for name, value in out.items()}

    core = unwrap(model)
    if not getattr(core, "shared", True) and isinstance(model, nn.parallel.DistributedDataParallel):
        raise ValueError(
            "the fine-tuning gradient cache needs a shared encoder under DDP; set chunk_size 0 "
            "or train a shared (siamese) encoder"
        )
    chunks = [("query", c) for c in split_batch(dict(query_inputs), chunk_size)]
    chunks += [("passage", c) for c in split_batch(dict(passage_inputs), chunk_size)]
    logged: dict[str, torch.Tensor] = {}

    def rep_fn(m: nn.Module, chunk: tuple[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        side, inputs = chunk
        return core.encode_query(**inputs) if side == "query" else core.encode_passage(**inputs)

    def chunk_loss_fn(m: nn.Module, chunk: tuple[str, dict[str, torch.Tensor]]) -> ChunkLoss:
        side, inputs = chunk  # through the (DDP) module's forward, so DDP sees every chunk
        q, p = m(inputs, None) if side == "query" else m(None, inputs)
        return ChunkLoss(q if side == "query" else p)

    def batch_loss(reps: torch.Tensor) -> torch.Tensor:
        out = _as_loss_dict(loss_fn(reps[:n_queries], reps[n_queries:]))
        logged.update({name: value.detach() for name, value in out.items() if name != "loss"})
        return out["loss"]

    result = gradcache_step(model, chunks, rep_fn, batch_loss, chunk_loss_fn, backward_fn=backward_fn)
    return {"loss": result.loss, **logged}


def _as_loss_dict(out: torch.Tensor | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return {"loss": out}
    if hasattr(out, "_asdict"):  # a NamedTuple such as DistillationLoss
        return dict(out._asdict())
    return dict(out)


def share_chunks_step(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    chunk_rows: int,
    units: Callable[[Mapping[str, torch.Tensor]], Mapping[str, int]],
    chunk_loss: Callable[
        [nn.Module, Mapping[str, torch.Tensor], Mapping[str, float]], Mapping[str, torch.Tensor]
    ],
    backward_fn: Callable[[torch.Tensor], None],
) -> dict[str, torch.Tensor]:
    """Back-propagate a loss made of means over units (masked tokens, queries) in sub-batches of
    ``chunk_rows`` rows, each term of a sub-batch weighted by its share of the batch's units, so
    the accumulated gradient is that of the whole batch's loss (0: the whole batch at once).

    Unlike the trainer's gradient accumulation, whose micro-batches each take their own mean (a
    token mean per micro-batch), the batch's means are kept exactly: for a mean over a batch's
    ``N`` units, ``sum_c (n_c / N) mean_c = mean``. This suits losses with no term coupling the
    rows of a batch (an MAE's two MLM losses, CDMAE eq. 9; a reranker's list-wise loss over each
    query's own group); a contrastive loss needs the gradient cache instead.

    Args:
        units: ``units(chunk)``, each term's units in a chunk (``{"enc_mlm": masked tokens}``),
            numbers or 0-dim tensors (:func:`masked_count`: counted on the device, no host sync).
        chunk_loss: ``chunk_loss(model, chunk, shares) -> {"loss": ..., term: ...}``: the chunk's
            loss with each term's mean multiplied by ``shares[term]`` (its share of the batch's
            units); the other values returned are summed over the chunks (the batch's terms).
        backward_fn: called once per chunk on its ``loss`` (fp16 loss scaling).
    Returns:
        The sums over the chunks, detached: the batch's loss and terms.
    """
    rows = len(next(iter(batch.values())))
    chunks = split_batch(dict(batch), chunk_rows) if chunk_rows and chunk_rows < rows else [dict(batch)]
    counts = [units(chunk) for chunk in chunks]
    totals = {term: sum(c[term] for c in counts) for term in counts[0]}
    sums: dict[str, torch.Tensor] = {}
    no_sync = getattr(model, "no_sync", None)  # DDP: all-reduce once, in the last chunk's backward
    for index, (chunk, count) in enumerate(zip(chunks, counts, strict=True)):
        shares = {term: share(count[term], totals[term]) for term in totals}
        last = index == len(chunks) - 1
        with contextlib.nullcontext() if (no_sync is None or last) else no_sync():
            out = chunk_loss(model, chunk, shares)
            backward_fn(out["loss"])
        for name, value in out.items():
            sums[name] = sums[name] + value.detach() if name in sums else value.detach()
    return sums
