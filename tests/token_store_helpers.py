"""What the token-store tests (tests/test_token_store.py, tests/test_token_store_streaming.py)
share besides conftest's ``tok`` and ``data`` fixtures: the seed and the batch comparison behind
"same seed, same batches", the collection :func:`write_token_store_data` writes for ``data``, and
the in-memory reference CoT-MAE read before the token store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dprflow.data.schemas import read_table, write_table
from dprflow.training.batches import StepBatches

SEED = 17
STEPS = 6
WORDS = ["wing", "lift", "flow", "plate", "heat", "shock", "wave", "layer", "speed", "drag", "aerofoil"]


def sentence(rng) -> str:
    words = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 12))))
    return words[0].upper() + words[1:] + str(rng.choice([".", "!", "?", ","]))


def write_token_store_data(root: Path) -> Path:
    """Documents in an unsorted doc_id order (the stores reorder them), several passages each,
    titles, sentence ends, one empty passage and one one-word document, written to ``root`` as a
    passages table, generated queries and a generic JSONL corpus."""
    rng = np.random.default_rng(0)
    rows, queries = [], []
    for d in rng.permutation(30):
        doc = f"doc{d}"
        title = "" if d % 4 == 0 else f"Title {d}"
        for position in range(int(rng.integers(1, 4))):
            text = " ".join(sentence(rng) for _ in range(int(rng.integers(1, 6))))
            if d == 7 and position == 1:
                text = ""
            pid = f"{doc}#{position}"
            rows.append((pid, doc, position, title, text, len(text.split())))
            for j in range(int(rng.integers(0, 4))):
                queries.append((pid, j, "" if j == 2 else " ".join(rng.choice(WORDS, size=4))))
    rows.append(("tiny#0", "tiny", 0, "", "drag", 1))
    passages = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"])
    write_table(passages, root / "passages.parquet", "passages")
    write_table(
        pd.DataFrame(queries, columns=["passage_id", "query_index", "text"]),
        root / "generated_queries.parquet",
        "generated_queries",
    )
    with open(root / "generic.jsonl", "w") as fh:
        for t in passages["text"]:
            fh.write(json.dumps({"text": t}) + "\n")
    return root


def assert_same_batches(old_items, new_items, make_batch, batch_size=4, steps=STEPS):
    """The batches of steps 0..steps-1 (epochs included) from both item sequences are equal."""
    assert len(old_items) == len(new_items)
    old = StepBatches(old_items, make_batch, SEED, batch_size)
    new = StepBatches(new_items, make_batch, SEED, batch_size)
    assert new.items is new_items  # the lazy items are not copied into a list
    for step in range(steps):
        a, b = old[step], new[step]
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (step, key)


def reference_cotmae_texts(path) -> list[str]:
    """The documents CoT-MAE read on passages before the token store (pretrain_mae.corpus_texts)."""
    table = read_table(path, "passages").sort_values(["doc_id", "position"], kind="stable")
    joined = table["title"].str.cat(table["text"], sep=" ").str.strip()
    return joined.groupby(table["doc_id"], sort=True).agg(" ".join).tolist()
