"""Gradient accumulation through a pre-training stage whose batches carry a batch-level value
(CoT-MAE's count of context fallbacks, a 0-dim tensor): the stage runs and logs it."""

from __future__ import annotations

import pandas as pd
from test_mae_stages import mae_args, passages, stats, tiny_init  # noqa: F401 (fixtures)

from dprflow.stages import pretrain_mae


def test_cotmae_with_gradient_accumulation(tiny_init, passages, tmp_path):  # noqa: F811
    out = tmp_path / "acc"
    args = mae_args("cotmae", tiny_init, out, passages, gradient_accumulation_steps=2, max_steps=2)
    assert pretrain_mae.main(args) == 0
    log = pd.read_csv(out / "train_log.csv")
    assert list(log["step"]) == [1, 2] and (log["loss"] > 0).all() and {"enc_mlm", "dec_mlm"} <= set(log)
