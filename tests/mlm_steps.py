"""A tiny BERT masked-language model stepped by the Trainer on padded batches: the reference
against which tests/test_training_speed.py (on the CPU) and tests/test_gpu.py (on a GPU) compare
each speed switch's loss and gradients."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM

from dprflow.stage_args import TrainArgs
from dprflow.training import speed
from dprflow.training.trainer import Trainer

TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def tiny_mlm(seed: int = 0, dropout: float = 0.0) -> BertForMaskedLM:
    torch.manual_seed(seed)
    config = BertConfig(**TINY, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return BertForMaskedLM(config)


def padded_batch(seed: int = 0, rows: int = 6, length: int = 12) -> dict[str, torch.Tensor]:
    """MLM inputs of different lengths (padding masked out), 20% of the real tokens as labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, TINY["vocab_size"], (rows, length), generator=g)
    lengths = torch.randint(3, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    labels = torch.where((torch.rand(rows, length, generator=g) < 0.2) & mask.bool(), ids, -100)
    labels[:, 0] = ids[:, 0]  # at least one label per row
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def mlm_step(model, batch):
    return {"loss": model(**batch).loss}


def trainer_for(model, args: TrainArgs, tmp_path: Path, batches=None) -> Trainer:
    batches = batches or [padded_batch(i) for i in range(8)]
    return Trainer(
        model,
        list(range(len(batches))),
        lambda rng, items: batches[items[0]],
        mlm_step,
        lambda m, d: m.save_pretrained(d),
        args,
        tmp_path / "ckpt",
        {"test": 1},
    )


def loss_and_grads(model, args: TrainArgs, tmp_path: Path) -> tuple[float, dict[str, torch.Tensor]]:
    trainer = trainer_for(model, dataclasses.replace(args, batch_size=1), tmp_path)
    trainer.model.train()
    out = trainer._accumulate(speed.to_device(padded_batch(0), trainer.dist.device))
    grads = {n: p.grad.cpu() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return float(out["loss"].detach()), grads


def assert_close(a: tuple[float, dict], b: tuple[float, dict], tol: float) -> None:
    assert a[1].keys() == b[1].keys() and len(a[1]) > 20
    assert math.isclose(a[0], b[0], rel_tol=tol)
    # Gradients that are zero in exact arithmetic (the attention key bias: softmax ignores a
    # per-row constant) are rounding noise: compared against the largest gradient.
    scale = max(g.abs().max().item() for g in b[1].values())
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=tol, atol=tol * scale, msg=name)
