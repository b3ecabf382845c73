"""The distributed helpers: identity with one process, and a real 2-process gloo run that must match
the single-process loss and gradients on the full batch.

The workers average the gradients over ranks with an ``all_reduce`` as DDP does (constructing a
real DDP module costs seconds of imports).
"""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from dprflow.finetuning.losses import contrastive_loss, distillation_loss
from dprflow.training import distributed

WORLD = 2
B_LOCAL, G, D_IN, H = 2, 3, 6, 5  # per-rank queries, group size, input and embedding sizes
TEMPERATURE = 0.5


class Tower(nn.Module):
    """A linear stand-in for the shared encoder, called like BiEncoder.forward(queries, passages)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(D_IN, H, bias=False)

    def forward(self, xq, xp):
        return self.linear(xq), self.linear(xp)


def full_batch():
    gen = torch.Generator().manual_seed(1)
    xq = torch.randn(WORLD * B_LOCAL, D_IN, generator=gen)
    xp = torch.randn(WORLD * B_LOCAL * G, D_IN, generator=gen)
    teacher = torch.randn(WORLD * B_LOCAL, G, generator=gen)
    return xq, xp, teacher


def losses(model, xq, xp, teacher, rank_offset, gather):
    """Contrastive and distillation losses; each backpropagated into its own gradient."""
    out = {}
    for name in ("contrastive", "distill"):
        model.zero_grad()
        q, p = model(xq, xp)
        p = gather(p)
        if name == "contrastive":
            loss = contrastive_loss(q, p, group_size=G, temperature=TEMPERATURE, rank_offset=rank_offset)
        else:
            loss = distillation_loss(
                q, p, teacher, group_size=G, temperature=TEMPERATURE, rank_offset=rank_offset
            ).loss
        loss.backward()
        out[name] = (loss.detach().clone(), model.linear.weight.grad.clone())
    return out


def _worker(rank: int, port: int, out_dir: str) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(WORLD)}
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    info = distributed.init_from_env(use_cuda=False)
    try:
        assert (info.rank, info.world_size, info.device.type) == (rank, WORLD, "cpu")
        assert distributed.is_main() == (rank == 0)
        xq, xp, teacher = full_batch()
        local_q = xq[rank * B_LOCAL : (rank + 1) * B_LOCAL]
        local_p = xp[rank * B_LOCAL * G : (rank + 1) * B_LOCAL * G]
        local_t = teacher[rank * B_LOCAL : (rank + 1) * B_LOCAL]
        result = losses(Tower(), local_q, local_p, local_t, rank * B_LOCAL, distributed.gather_with_grad)
        for name in ("contrastive", "distill"):  # what DDP does to the gradients: average over ranks
            torch.distributed.all_reduce(result[name][1])
            result[name][1].div_(WORLD)

        gathered = distributed.gather_with_grad(local_p)
        result["gathered"] = gathered.detach()
        try:
            distributed.gather_with_grad(torch.zeros(rank + 1, 2))  # different shapes on the two ranks
            result["mismatch"] = "no error"
        except ValueError as exc:
            result["mismatch"] = str(exc)
        distributed.barrier()
        torch.save(result, f"{out_dir}/rank{rank}.pt")
    finally:
        distributed.cleanup()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_single_process_is_identity(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    info = distributed.init_from_env(use_cuda=False)
    assert (info.rank, info.world_size, info.local_rank, info.device) == (0, 1, 0, torch.device("cpu"))
    assert info.is_main and distributed.is_main() and distributed.get_world_size() == 1
    t = torch.randn(3, 2, requires_grad=True)
    assert distributed.gather_with_grad(t) is t
    distributed.barrier()  # no-ops
    distributed.cleanup()


def spawn(worker, args: tuple) -> None:
    """``WORLD`` processes of ``worker(rank, *args)``, forked from a server that imported torch
    (:mod:`stage_process`) rather than each a fresh interpreter importing it."""
    from stage_process import forkserver

    forkserver()  # the server preloads torch before torch.multiprocessing starts it
    mp.start_processes(worker, args=args, nprocs=WORLD, join=True, start_method="forkserver")


def test_two_gloo_ranks_match_the_full_batch(tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    spawn(_worker, (_free_port(), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    xq, xp, teacher = full_batch()
    full = losses(Tower(), xq, xp, teacher, 0, lambda p: p)
    for name in ("contrastive", "distill"):
        full_loss, full_grad = full[name]
        mean_loss = sum(r[name][0] for r in ranks) / WORLD
        assert torch.allclose(mean_loss, full_loss, atol=1e-6), name  # average of rank losses == full loss
        for r in ranks:  # DDP-averaged gradient == full-batch gradient, on every rank
            assert full_grad.abs().sum() > 0
            assert torch.allclose(r[name][1], full_grad, atol=1e-6), name
    assert torch.equal(ranks[0]["gathered"], xp) and torch.equal(ranks[1]["gathered"], xp)
    assert all("same shape on every rank" in r["mismatch"] for r in ranks)


# -- coCondenser across processes (coCondenser eq. 6/7, gradient cache eq. 9-12) ----------------------
CO_TINY = dict(vocab_size=60, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16)
CO_LENGTHS = [7, 3, 5, 6, 2, 7, 4, 6]  # 4 documents x 2 spans; rank 0 gets rows 0-3, rank 1 rows 4-7


def co_model(init_dir: str):
    from dprflow.pretraining.condenser.model import Condenser, CondenserConfig

    torch.manual_seed(1)  # the random head: the same on every process
    return Condenser.from_pretrained(init_dir, CondenserConfig(n_early=1)).double().eval()


def co_batch():
    """8 spans with different masked counts on the two ranks, so the MLM weighting matters."""
    from dprflow.pretraining.masking import mask_tokens, special_tokens_mask

    g = torch.Generator().manual_seed(3)
    ids = torch.zeros(len(CO_LENGTHS), 9, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for b, n in enumerate(CO_LENGTHS):
        ids[b, 0], ids[b, n + 1] = 1, 2
        ids[b, 1 : n + 1] = torch.randint(10, 60, (n,), generator=g)
        attention[b, : n + 2] = 1
    masked = mask_tokens(ids, special_tokens_mask(ids, attention, (0, 1, 2)), 3, 60, g, p=0.4)
    return {"input_ids": masked.input_ids, "attention_mask": attention, "labels": masked.labels}


def co_grads(model):
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def _co_worker(rank: int, port: int, out_dir: str, init_dir: str) -> None:
    from dprflow.training.steps import cocondenser_step

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(WORLD)}
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    distributed.init_from_env(use_cuda=False)
    try:
        model = co_model(init_dir)
        rows = len(CO_LENGTHS) // WORLD
        local = {k: v[rank * rows : (rank + 1) * rows] for k, v in co_batch().items()}
        result = {}
        for name, chunk_size in (("plain", 0), ("gradcache", 3)):  # chunks of 3 and 1 spans
            model.zero_grad(set_to_none=True)
            out = cocondenser_step(model, local, chunk_size, lambda t: t.backward())
            grads = co_grads(model)
            for value in grads.values():  # what DDP does: average over ranks
                torch.distributed.all_reduce(value)
                value.div_(WORLD)
            result[name] = (out.loss.clone(), out.contrastive.clone(), grads)
        torch.save(result, f"{out_dir}/co-rank{rank}.pt")
    finally:
        distributed.cleanup()


def test_cocondenser_two_gloo_ranks_match_the_global_batch(tmp_path):
    """Two processes of 2 documents each train as one process on the 4 documents: eq. 6's
    negatives are the spans of both processes, and the MLM token mean is the global one."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    from transformers import BertConfig, BertForMaskedLM

    from dprflow.pretraining.condenser.model import cocondenser_loss

    init_dir = tmp_path / "init"
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(**CO_TINY)).save_pretrained(init_dir)
    spawn(_co_worker, (_free_port(), str(tmp_path), str(init_dir)))
    ranks = [torch.load(tmp_path / f"co-rank{r}.pt") for r in range(WORLD)]

    model = co_model(str(init_dir))
    full = cocondenser_loss(model, co_batch())
    full.loss.backward()
    expected = co_grads(model)
    assert len(expected) > 20
    # Gradients that are zero in exact arithmetic (attention key bias) are rounding noise: floor.
    floor = 1e-9 * max(v.abs().max() for v in expected.values())
    for name in ("plain", "gradcache"):
        for r in ranks:
            loss, contrastive, grads = r[name]
            assert grads.keys() == expected.keys()
            for key, value in expected.items():
                assert torch.allclose(grads[key], value, rtol=1e-5, atol=floor), (name, key)
        mean_co = sum(r[name][1] for r in ranks) / WORLD  # eq. 7: the mean over the 2n global spans
        assert mean_co.item() == pytest.approx(full.contrastive.item(), rel=1e-10)
        mean_loss = sum(r[name][0] for r in ranks) / WORLD
        assert mean_loss.item() == pytest.approx(full.loss.item(), rel=1e-10)
