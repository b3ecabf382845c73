"""Gradient cache: the full-batch gradient of a contrastive loss, computed in sub-batches.

A contrastive loss couples every example of the batch (each one's negatives are the others), so
a plain implementation keeps the activations of the whole batch in memory. Gradient caching
(Gao et al., 2021, "Scaling deep contrastive learning batch size under memory limited setup";
coCondenser §3.3, eq. 8-12) splits the computation in three:

1. representations of every chunk without a graph (``torch.no_grad``): ``h = [h_1, ..., h_N]``;
2. the batch loss on the detached representations, back-propagated to them only: the cache
   ``v_j = dL_co / dh_j`` (coCondenser eq. 9);
3. per chunk, the representations again *with* a graph, and one backward of the surrogate
   ``sum_j <h_j, v_j> + w_c * L_local,c``, whose parameter gradient is the chunk's share of the
   full-batch gradient (eq. 10-12). Gradients accumulate over the chunks.

The loss is::

    L = L_co(h_1..h_N) + sum_c w_c * L_local,c          (coCondenser eq. 8, scaled by 1 / 2n)

where ``L_co`` couples the batch (the contrastive loss, a mean over the ``N`` rows) and
``L_local,c`` is chunk ``c``'s own loss that needs no other chunk (the MLM losses), with
weights ``w_c`` summing to 1 so that ``sum_c w_c L_local,c`` is the full-batch local loss (by
default ``w_c = N_c / N``, right for a per-row mean; a per-token mean weights by token counts).

Dropout: the recomputation in step 3 must see the same dropout masks as step 1, else the cached
``v_j`` belong to other representations. The torch random state (CPU, and the model's GPU when
it runs on one: :func:`dprflow.training.speed.rng_devices`) is saved before each chunk's step-1
forward and restored around its step-3 forward, as the GradCache library's ``RandContext`` does. Step 3 runs inside ``torch.random.fork_rng``, so after
the call the random state is the one left by step 1 whatever the chunking.

Limits: ``loss_fn`` sees the representations of this process only; a multi-process contrastive
loss needs them gathered (with gradient) inside ``loss_fn``. With DDP, chunks but the last run
under ``model.no_sync()`` so the gradients are all-reduced once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from dprflow.training.speed import rng_devices


class ChunkLoss(NamedTuple):
    """What ``chunk_loss_fn`` returns for one chunk (a plain ``(reps, loss)`` tuple also works)."""

    reps: torch.Tensor  # [N_c, H] the representations, with a graph (same as rep_fn's)
    loss: torch.Tensor | None = None  # the chunk's local loss (a mean over the chunk), or None
    parts: Mapping[str, torch.Tensor] = {}  # components of the local loss, for logging


class GradCacheOutput(NamedTuple):
    """Loss values of one gradient-cache step (all detached: the gradients are already in ``.grad``)."""

    loss: torch.Tensor  # cached_loss + local_loss: the full-batch loss
    cached_loss: torch.Tensor  # loss_fn on all representations (the contrastive loss)
    local_loss: torch.Tensor  # sum_c w_c * local loss of chunk c
    parts: dict[str, torch.Tensor]  # sum_c w_c * parts of chunk c
    reps: torch.Tensor  # [N, H] the representations of step 1


class RandState:
    """The torch random state of the CPU and of the GPU ``device`` (when the model runs on one),
    to replay a forward."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.cpu = torch.get_rng_state()
        self.devices = rng_devices(device or torch.device("cpu"))
        self.cuda = [torch.cuda.get_rng_state(d) for d in self.devices]

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Run the block from this state; the random state outside the block is left untouched."""
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            for index, state in zip(self.devices, self.cuda, strict=True):
                torch.cuda.set_rng_state(state, index)
            yield


def split_batch(batch: Mapping[str, torch.Tensor], chunk_size: int) -> list[dict[str, torch.Tensor]]:
    """Split a batch of tensors (first dimension = rows) into chunks of ``chunk_size`` rows.

    The last chunk holds the remainder when the batch size is not a multiple of ``chunk_size``.
    Values that are not tensors are passed to every chunk unchanged.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    sizes = {v.size(0) for v in batch.values() if isinstance(v, torch.Tensor)}
    if len(sizes) != 1:
        raise ValueError(f"the batch's tensors disagree on the number of rows: {sorted(sizes)}")
    rows = sizes.pop()
    return [
        {k: v[start : start + chunk_size] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        for start in range(0, rows, chunk_size)
    ]


def _unpack(out: Any) -> ChunkLoss:
    if isinstance(out, ChunkLoss):
        return out
    if isinstance(out, torch.Tensor):
        return ChunkLoss(out)
    return ChunkLoss(*out)


def gradcache_step(
    model: torch.nn.Module,
    batch_chunks: Sequence[Any],
    rep_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    chunk_loss_fn: Callable[[torch.nn.Module, Any], Any],
    *,
    chunk_weights: Sequence[float | torch.Tensor] | None = None,
    backward_fn: Callable[[torch.Tensor], None] | None = None,
) -> GradCacheOutput:
    """Accumulate in ``.grad`` the gradient of ``loss_fn(all reps) + sum_c w_c * local_c``, chunk by chunk.

    Memory is that of one chunk's graph plus the ``[N, H]`` representations, whatever ``N``; the
    gradient equals the full-batch one (up to float rounding), dropout included (module
    docstring). The caller zeroes the gradients before and steps the optimizer after.

    Assumes: ``rep_fn(model, chunk)`` and the representations of ``chunk_loss_fn(model, chunk)``
    compute the same thing, and ``chunk_loss_fn`` runs that computation *first* (so that it
    consumes the same random numbers as ``rep_fn`` before anything else, e.g. a head).

    Args:
        model: the module (or its DDP wrapper) passed to ``rep_fn`` and ``chunk_loss_fn``.
        batch_chunks: the chunks of the batch, in order (:func:`split_batch`); sizes may differ.
        rep_fn: ``(model, chunk) -> [N_c, H]``, step 1 (run under ``torch.no_grad``).
        loss_fn: ``[N, H] -> scalar``, the loss that couples the batch (run with autocast off,
            in at least float32).
        chunk_loss_fn: ``(model, chunk) -> ChunkLoss(reps [N_c, H], loss, parts)``, step 3; the
            local loss may be ``None`` (pure contrastive) and ``parts`` empty.
        chunk_weights: ``w_c`` of each chunk's local loss (and parts); default ``N_c / N``.
        backward_fn: runs the backward of a surrogate loss; default ``t.backward()``; pass
            ``lambda t: scaler.scale(t).backward()`` with an fp16 ``GradScaler``.

    Returns:
        :class:`GradCacheOutput`, detached loss values for logging.

    Example::

        chunks = split_batch({"input_ids": ids, "attention_mask": mask, "labels": labels}, 8)
        out = gradcache_step(
            model, chunks,
            rep_fn=lambda m, c: m.encode(c["input_ids"], c["attention_mask"]),
            loss_fn=cocondenser_contrastive_loss,
            chunk_loss_fn=lambda m, c: (lambda o: ChunkLoss(o.cls, o.loss))(m(**c)),
        )
        optimizer.step()
    """
    if not batch_chunks:
        raise ValueError("gradcache_step needs at least one chunk")
    backward_fn = backward_fn or (lambda t: t.backward())

    # Step 1: representations without a graph, remembering the random state of each chunk.
    device = next(model.parameters(), torch.empty(0)).device
    states: list[RandState] = []
    reps_list: list[torch.Tensor] = []
    with torch.no_grad():
        for chunk in batch_chunks:
            states.append(RandState(device))
            reps_list.append(rep_fn(model, chunk))
    sizes = [r.size(0) for r in reps_list]
    total = sum(sizes)
    if chunk_weights is None:
        chunk_weights = [n / total for n in sizes]
    if len(chunk_weights) != len(batch_chunks):
        raise ValueError(f"{len(chunk_weights)} chunk_weights for {len(batch_chunks)} chunks")

    # Step 2: the batch loss on detached representations; its gradient w.r.t. them is the cache.
    reps = torch.cat(reps_list).detach()  # [N, H]
    leaf = reps.to(torch.promote_types(reps.dtype, torch.float32)).requires_grad_()
    with torch.enable_grad(), torch.autocast(leaf.device.type, enabled=False):
        cached_loss = loss_fn(leaf)
        (cache,) = torch.autograd.grad(cached_loss, leaf)  # [N, H]: v_j = dL_co / dh_j (eq. 9)
    grads = cache.split(sizes)

    # Step 3: per chunk, recompute with a graph under the same random state; backward the surrogate.
    no_sync = getattr(model, "no_sync", None)
    local_loss = reps.new_zeros((), dtype=cache.dtype)
    parts: dict[str, torch.Tensor] = {}
    for index, (chunk, state, grad, weight) in enumerate(
        zip(batch_chunks, states, grads, chunk_weights, strict=True)
    ):
        last = index == len(batch_chunks) - 1
        sync = contextlib.nullcontext() if (no_sync is None or last) else no_sync()
        with sync, state.replay():
            out = _unpack(chunk_loss_fn(model, chunk))
            if out.reps.shape != grad.shape:
                raise ValueError(
                    f"chunk {index}: chunk_loss_fn gave representations {tuple(out.reps.shape)}, "
                    f"rep_fn gave {tuple(grad.shape)}"
                )
            surrogate = (out.reps.to(grad.dtype) * grad).sum()  # sum_j <h_j, v_j> (eq. 11)
            if out.loss is not None:
                # a weight counted on the device (a tensor) computes in the loss's precision
                weight = weight.to(out.loss.dtype) if isinstance(weight, torch.Tensor) else weight
                surrogate = surrogate + weight * out.loss  # this chunk's share of the local loss (eq. 12)
                local_loss = local_loss + weight * out.loss.detach().to(local_loss.dtype)
            backward_fn(surrogate)
        for name, value in out.parts.items():
            parts[name] = parts.get(name, 0.0) + weight * value.detach()
    cached_loss = cached_loss.detach()
    return GradCacheOutput(cached_loss + local_loss, cached_loss, local_loss, parts, reps)
