"""The fine-tuning stages' tiny training set and command line, shared by every test that trains a
retriever or a reranker on it (tests/test_training.py and the stage tests beside it).

:func:`write_train_data` writes what conftest's ``train_data`` fixture hands out; :func:`argv` is a
``train_retriever``/``train_reranker`` command line over that folder (small batches, a checkpoint
every 2 steps, one thread), any flag given as a keyword; :func:`same_weights` compares two trained
models bit for bit, which is how the determinism and resume tests say "the same run"."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load_file

from dprflow.data.schemas import write_table


def write_train_data(folder: Path) -> Path:
    """12 training queries over 24 passages, a negative pool per query, written to ``folder``."""
    n = 12
    passages = pd.DataFrame(
        {
            "passage_id": [f"d{i}#0" for i in range(2 * n)],
            "doc_id": [f"d{i}" for i in range(2 * n)],
            "position": 0,
            "title": "",
            "text": [f"passage number {i} about topic {i % 5}" for i in range(2 * n)],
            "n_tokens": 6,
        }
    )
    queries = pd.DataFrame(
        {"query_id": [f"q{i}" for i in range(n)], "text": [f"topic {i}" for i in range(n)], "split": "train"}
    )
    qrels = pd.DataFrame(
        {"query_id": queries["query_id"], "doc_id": [f"d{i}" for i in range(n)], "relevance": 1}
    )
    rows = [
        (f"q{i}", f"d{j}#0", float(-j), r + 1)
        for i in range(n)
        for r, j in enumerate(x for x in range(n, 2 * n))
    ]
    negatives = pd.DataFrame(rows, columns=["query_id", "passage_id", "score", "rank"])
    write_table(passages, folder / "passages.parquet", "passages")
    write_table(queries, folder / "queries.parquet", "queries")
    write_table(qrels, folder / "qrels.parquet", "qrels")
    write_table(negatives, folder / "negatives.parquet", "negatives")
    return folder


def argv(data: Path, init: Path, out: str, **extra) -> list[str]:
    args = [
        "--init",
        str(init),
        "--queries",
        str(data / "queries.parquet"),
        "--qrels",
        str(data / "qrels.parquet"),
        "--passages",
        str(data / "passages.parquet"),
        "--negatives",
        str(data / "negatives.parquet"),
        "--out",
        str(data / out),
        "--checkpoint-dir",
        str(data / f"{out}.ckpt"),
        "--batch-size",
        "4",
        "--group-size",
        "3",
        "--epochs",
        "2",
        "--checkpoint-every",
        "2",
        "--learning-rate",
        "1e-3",
        "--threads",
        "1",
    ]
    for key, value in extra.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return args


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
