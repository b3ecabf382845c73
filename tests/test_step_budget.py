"""A step budget sets the number of optimizer steps (as Hugging Face's ``max_steps``), cycling over
the examples as often as needed; without one, ``epochs`` passes run (issue 13, item 6)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dprflow.stage_args import TrainArgs
from dprflow.training.trainer import Trainer, total_steps


def test_total_steps_is_the_budget_or_the_epochs():
    assert total_steps(100, TrainArgs(batch_size=8, epochs=3)) == 36  # 12 per epoch
    # coCondenser preset stage two: 8.84M passages / 2,048 per update is 4,317 steps per epoch;
    # a budget of 120,000 trains 120,000 (it was capped at 4,317 before).
    assert total_steps(8_841_823, TrainArgs(batch_size=2048, epochs=1, max_steps=120_000)) == 120_000
    assert total_steps(100, TrainArgs(batch_size=8, epochs=3, max_steps=5)) == 5
    with pytest.raises(ValueError, match="fewer than one batch"):
        total_steps(3, TrainArgs(batch_size=8, max_steps=10))


def test_trainer_runs_the_budget_over_several_epochs(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    seen: list[list[int]] = []

    def make_batch(rng: np.random.Generator, items: list[int]) -> torch.Tensor:
        seen.append(list(items))
        return torch.tensor(items, dtype=torch.float32).unsqueeze(1)

    def step(model: torch.nn.Module, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": model(batch).pow(2).mean()}

    args = TrainArgs(batch_size=4, epochs=1, max_steps=7, checkpoint_every=100, precision="fp32")
    trainer = Trainer(
        torch.nn.Linear(1, 1), list(range(10)), make_batch, step, lambda m, p: None, args, tmp_path, {}
    )
    history = trainer.train(lambda m, p: None, tmp_path / "log.csv")
    assert [row["step"] for row in history] == list(range(1, 8))  # 7 steps, not the 2 of one epoch
    assert trainer.scheduler.get_last_lr()[0] == 0.0  # the linear decay ends at the budget
    # 2 steps per epoch (10 // 4): epochs 0-3, each a permutation of the items, 2 items left out
    for epoch in range(3):
        items = seen[2 * epoch] + seen[2 * epoch + 1]
        assert len(set(items)) == 8
    assert seen[0] + seen[1] != seen[2] + seen[3]  # a new order each epoch
