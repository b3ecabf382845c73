"""Mistakes caught before work starts and failures reported as what they are (issue 18): stale
checkpoints, unsafe checkpoints, a full disk, config checks at DAG-build time, memory estimates."""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_training import argv, same_weights, train_data, tiny_init  # noqa: F401 (fixtures)

from dprflow.data import schemas
from dprflow.data.schemas import DiskFullError, write_table
from dprflow.stages import train_retriever

ROOT = Path(__file__).resolve().parents[1]


def killed_after_step_3(data: Path, init: Path, out: str) -> None:
    """Run train_retriever in a subprocess killed after step 3 (its step-2 checkpoint kept)."""
    cmd = [sys.executable, "-m", "dprflow.stages.train_retriever", *argv(data, init, out)]
    env = {**os.environ, "DPRFLOW_KILL_AFTER_STEP": "3", "PYTHONPATH": str(ROOT / "src")}
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (data / f"{out}.ckpt" / "step-2" / "COMPLETE").exists()


def rewrite_negatives(data: Path) -> None:
    """Other negatives at the same path (what a changed bm25.k1 does upstream)."""
    negatives = pd.read_parquet(data / "negatives.parquet")
    negatives = negatives[negatives["rank"] <= 4].copy()
    negatives["passage_id"] = negatives["passage_id"].iloc[::-1].to_numpy()
    write_table(negatives, data / "negatives.parquet", "negatives")


def test_checkpoint_from_other_input_data_is_ignored_and_the_log_says_why(train_data, tiny_init, caplog):  # noqa: F811
    killed_after_step_3(train_data, tiny_init, "resumed")
    rewrite_negatives(train_data)
    assert train_retriever.main(argv(train_data, tiny_init, "resumed")) == 0
    assert "ignoring checkpoint" in caplog.text
    assert "input_sha256" in caplog.text and "negatives.parquet" in caplog.text
    assert "resumed from" not in caplog.text
    # A clean run on the new negatives ends with the same weights and the same loss log.
    assert train_retriever.main(argv(train_data, tiny_init, "clean")) == 0
    assert same_weights(train_data / "clean", train_data / "resumed")
    a = pd.read_csv(train_data / "clean" / "train_log.csv")
    b = pd.read_csv(train_data / "resumed" / "train_log.csv")
    assert a["step"].tolist() == b["step"].tolist() == [1, 2, 3, 4, 5, 6]
    pd.testing.assert_series_equal(a["loss"], b["loss"], rtol=1e-6)


def test_checkpoint_holding_a_pickled_object_is_refused(train_data, tiny_init, capsys):  # noqa: F811
    killed_after_step_3(train_data, tiny_init, "m")
    state_file = train_data / "m.ckpt" / "step-2" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)  # the trainer's own state loads safely
    state["payload"] = argparse.Namespace(run="code")  # any object a pickle could rebuild
    torch.save(state, state_file)
    assert train_retriever.main(argv(train_data, tiny_init, "m")) == 1
    err = capsys.readouterr().err
    assert "refusing to resume" in err and str(state_file) in err
    assert not (train_data / "m").exists()


def test_disk_full_during_a_checkpoint_is_reported_and_leaves_no_checkpoint(
    train_data,  # noqa: F811
    tiny_init,  # noqa: F811
    monkeypatch,
    capsys,
):
    def short_write(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:595] . unexpected pos 116605568 vs 116605456")

    monkeypatch.setattr(torch, "save", short_write)
    monkeypatch.setattr(schemas, "free_bytes", lambda path: 4096)
    assert train_retriever.main(argv(train_data, tiny_init, "full")) == 1
    err = capsys.readouterr().err
    assert "no space left on device while writing" in err
    assert "trainer_state.pt" in err and "bytes needed" in err and "4096 bytes free" in err
    ckpt = train_data / "full.ckpt"
    assert not list(ckpt.glob("step-*")) and not list(ckpt.glob(".tmp-*"))
    assert not (train_data / "full").exists()


def test_disk_full_during_a_table_write_names_the_path_and_leaves_nothing(tmp_path, monkeypatch):
    def no_space(table, where, *args, **kwargs):
        Path(where).write_bytes(b"PAR1 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(schemas.pq, "write_table", no_space)
    target = tmp_path / "sub" / "run.parquet"
    frame = pd.DataFrame({"query_id": ["q"], "passage_id": ["p"], "score": [1.0], "rank": [1]})
    with pytest.raises(DiskFullError, match="no space left on device while writing .*run.parquet"):
        write_table(frame, target, "negatives")
    assert list((tmp_path / "sub").iterdir()) == []
