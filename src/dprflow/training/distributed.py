"""Data-parallel helpers, ready for ``torchrun`` and a no-op with one process.

The training stages call :func:`init_from_env` once; with ``WORLD_SIZE`` unset or 1 there is no
process group and every helper here is the identity (one code path for one process and many).

In-batch negatives across GPUs: each rank encodes its share of the batch, gathers the passage
embeddings of all ranks with :func:`gather_with_grad`, and scores its local queries against
them (:func:`dprflow.finetuning.losses.contrastive_loss` with ``rank_offset = rank * local_batch``)::

    q, p = model(query_inputs, passage_inputs)                  # local [B, H], [B * G, H]
    p_all = gather_with_grad(p)                                  # [world * B * G, H]
    loss = contrastive_loss(q, p_all, group_size=G, rank_offset=info.rank * q.size(0))
    loss.backward()                                              # DDP averages the gradients

The mean of the per-rank losses equals the loss of the full batch, and with the backward rule
of :func:`gather_with_grad` the DDP-averaged gradient equals its gradient (tested in
``tests/test_distributed.py``): no rescaling of the loss by the world size is needed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: its rank among ``world_size`` processes and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from exc


def init_from_env(backend: str | None = None, use_cuda: bool | None = None) -> DistInfo:
    """Set up this process from the variables ``torchrun`` exports (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).

    With ``WORLD_SIZE > 1`` the default process group is initialised (``env://``: ``MASTER_ADDR``
    and ``MASTER_PORT`` must be set, as ``torchrun`` does), unless it already is.

    Args:
        backend: ``"nccl"`` or ``"gloo"``; default ``"nccl"`` on CUDA, else ``"gloo"``.
        use_cuda: run on ``cuda:LOCAL_RANK``; default: when CUDA is available.

    Returns:
        ``DistInfo(rank, world_size, local_rank, device)``.
    """
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    if use_cuda is None:
        use_cuda = torch.cuda.is_available()
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA device(s) are visible; "
                "start at most one process per GPU (torchrun --nproc-per-node)"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if use_cuda else "gloo")
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size)
        log.info("process group %s: rank %d of %d on %s", backend, rank, world_size, device)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def is_distributed() -> bool:
    """True when a process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """True on rank 0 (and in a single process): the one that logs and writes outputs."""
    return get_rank() == 0


def barrier() -> None:
    """Wait for all ranks; nothing with one process."""
    if is_distributed():
        dist.barrier()


def cleanup() -> None:
    """Destroy the process group if one was created."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class _GatherWithGrad(torch.autograd.Function):
    """``all_gather`` along dim 0 whose backward sums the gradients of all ranks' losses.

    Forward: ``[n, ...]`` on each rank -> ``[world * n, ...]``, rank ``r``'s rows at ``r*n:(r+1)*n``.
    Backward: every rank's loss sends a gradient to every slice of the gathered tensor; they are
    summed over ranks (``all_reduce``) and each rank keeps the slice of its own input. This is
    the gradient of the sum of the rank losses with respect to the local input, so after DDP's
    averaging the update is the gradient of the mean rank loss, i.e. of the full-batch loss.

    (Tevatron instead puts the local tensor back into the gathered list, which keeps only this
    rank's own loss's gradient, and scales the loss by the world size; that is exact only when
    the queries are gathered as well and every rank computes the full-batch loss. With the
    summing backward both usages are exact, without any rescaling.)
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        world_size, rank = dist.get_world_size(), dist.get_rank()
        ctx.rank, ctx.rows = rank, tensor.size(0)
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(world_size)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def _check_same_shape(tensor: torch.Tensor) -> None:
    shape = torch.tensor(list(tensor.shape), dtype=torch.long, device=tensor.device)
    shapes = [torch.empty_like(shape) for _ in range(dist.get_world_size())]
    dist.all_gather(shapes, shape)
    if any(not torch.equal(s, shape) for s in shapes):
        raise ValueError(
            f"gather_with_grad needs the same shape on every rank, got {[tuple(s.tolist()) for s in shapes]}; "
            "use equal local batches (drop the last incomplete batch)"
        )


def gather_with_grad(tensor: torch.Tensor, check_shapes: bool = True) -> torch.Tensor:
    """Concatenate ``tensor`` from all ranks along dim 0, keeping gradients; the identity with one process.

    The result holds rank ``r``'s rows at ``r * n : (r + 1) * n``. Gradients reach the local
    rows from the losses of all ranks (see :class:`_GatherWithGrad`), so use it in every rank's
    loss and let DDP average the gradients, as usual.

    Args:
        tensor: ``[n, ...]``, the same shape on every rank.
        check_shapes: gather the shapes first and raise a ``ValueError`` if they differ (one
            extra small collective); otherwise mismatched shapes fail inside the backend.

    Returns:
        ``[world_size * n, ...]``.
    """
    if not is_distributed():
        return tensor
    if check_shapes:
        _check_same_shape(tensor)
    return _GatherWithGrad.apply(tensor)
