"""How the pre-training losses are stepped: the machinery that calls a model's own loss.

A model module holds its model and its loss as the paper writes it; this module decides how a
batch is back-propagated: whole, or in chunks with a gradient cache (coCondenser §3.3, eq. 9-12).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from dprflow.pretraining.condenser.model import (
    CoCondenserOutput,
    cocondenser_contrastive_loss,
    cocondenser_loss,
    unwrap,
)
from dprflow.pretraining.masking import IGNORE_INDEX
from dprflow.training.gradcache import ChunkLoss, gradcache_step, split_batch


def cocondenser_step(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    chunk_size: int,
    backward_fn: Callable[[torch.Tensor], None],
) -> CoCondenserOutput:
    """Back-propagate the coCondenser loss (eq. 7) of ``batch``: whole, or with a gradient cache in
    chunks of ``chunk_size`` spans when the batch holds more (0: always whole). Same gradients
    either way; returns the loss terms detached, for logging."""
    if chunk_size and chunk_size < len(batch["input_ids"]):
        return cocondenser_gradcache_step(model, batch, chunk_size, backward_fn=backward_fn)
    out = cocondenser_loss(model, batch)
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

    Args:
        model: a :class:`Condenser` (or its DDP wrapper).
        batch: as in :func:`cocondenser_loss`; any number of rows ``2n``.
        chunk_size: spans per sub-batch; the last chunk holds the remainder.
        backward_fn: see :func:`dprflow.training.gradcache.gradcache_step` (fp16 grad scaling).
    """
    core = unwrap(model)
    chunks = split_batch(batch, chunk_size)
    counts = [int((c["labels"] != IGNORE_INDEX).sum()) for c in chunks]  # masked tokens per chunk
    total = max(sum(counts), 1)

    def rep_fn(m: nn.Module, chunk: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return core.encode(chunk["input_ids"], chunk["attention_mask"], chunk.get("token_type_ids"))

    def chunk_loss_fn(m: nn.Module, chunk: Mapping[str, torch.Tensor]) -> ChunkLoss:
        out = m(**chunk)  # the backbone runs first: same dropout masks as rep_fn
        return ChunkLoss(out.cls, out.loss, {"head_mlm": out.head_mlm, "backbone_mlm": out.backbone_mlm})

    result = gradcache_step(
        model,
        chunks,
        rep_fn,
        lambda reps: cocondenser_contrastive_loss(reps, core.config.temperature),
        chunk_loss_fn,
        chunk_weights=[c / total for c in counts],
        backward_fn=backward_fn,
    )
    return CoCondenserOutput(
        result.loss, result.cached_loss, result.parts["head_mlm"], result.parts["backbone_mlm"]
    )
