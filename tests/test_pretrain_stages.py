"""The pre-training stages on a tiny random BERT: Condenser on the generic corpus, coCondenser on
a collection's documents with and without the gradient cache, resume after a kill, span sampling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import kill_then_resume, save_tiny_bert
from safetensors.torch import load_file
from transformers import AutoModel

from dprflow.data.schemas import write_table
from dprflow.pretraining.condenser.data import sample_spans
from dprflow.pretraining.masking import wordpiece_word_ids
from dprflow.stages import pretrain_corpus, pretrain_generic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    # No dropout, so that a chunked (gradient-cache) step and a full-batch step see the same network.
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_pt"), layers=4, dropout=0.0)


@pytest.fixture(scope="module")
def generic(tiny_init, tmp_path_factory):
    out = tmp_path_factory.mktemp("generic")
    args = [
        "--init",
        str(tiny_init),
        "--out",
        str(out / "model"),
        "--checkpoint-dir",
        str(out / "ckpt"),
        "--batch-size",
        "4",
        "--max-steps",
        "3",
        "--max-length",
        "32",
        "--threads",
        "1",
    ]
    assert pretrain_generic.main(args) == 0
    return out / "model"


@pytest.fixture
def passages(tmp_path):
    rng = np.random.default_rng(0)
    words = ["wing", "lift", "flow", "plate", "heat", "shock", "wave", "layer", "speed", "drag"]
    rows = []
    for d in range(12):
        for position in range(2):
            text = " ".join(rng.choice(words, size=20))
            rows.append((f"d{d}#{position}", f"d{d}", position, "", text, 20))
    rows.append(("short#0", "short", 0, "", "tiny", 1))  # too short for two spans: skipped
    table = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"])
    write_table(table, tmp_path / "passages.parquet", "passages")
    return tmp_path / "passages.parquet"


def corpus_args(init, passages, out: Path, **extra) -> list[str]:
    args = [
        "--init",
        str(init),
        "--passages",
        str(passages),
        "--out",
        str(out),
        "--checkpoint-dir",
        str(out.with_name(out.name + ".ckpt")),
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--span-min",
        "4",
        "--span-max",
        "12",
        "--checkpoint-every",
        "2",
        "--threads",
        "1",
    ]
    for key, value in extra.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return args


def test_generic_stage_writes_a_plain_bert_and_the_head(generic):
    assert (generic / "condenser_head").is_dir()
    model = AutoModel.from_pretrained(generic)
    assert model.config.num_hidden_layers == 4
    log = pd.read_csv(generic / "train_log.csv")
    assert log["step"].tolist() == [1, 2, 3] and {"head_mlm", "backbone_mlm"} <= set(log.columns)


def test_corpus_stage_gradient_cache_gives_the_same_model(generic, passages, tmp_path, caplog):
    plain = tmp_path / "plain"
    cached = tmp_path / "cached"
    assert pretrain_corpus.main(corpus_args(generic, passages, plain, precision="fp32")) == 0
    assert "documents_too_short_skipped: 1" in caplog.text
    assert pretrain_corpus.main(corpus_args(generic, passages, cached, chunk_size=3, precision="fp32")) == 0
    a, b = load_file(plain / "model.safetensors"), load_file(cached / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
    la, lb = pd.read_csv(plain / "train_log.csv"), pd.read_csv(cached / "train_log.csv")
    np.testing.assert_allclose(la["contrastive"], lb["contrastive"], rtol=1e-4)


def test_corpus_stage_resumes_after_a_kill(generic, passages, tmp_path):
    whole = tmp_path / "whole"
    assert pretrain_corpus.main(corpus_args(generic, passages, whole)) == 0
    resumed = tmp_path / "resumed"
    kill_then_resume("pretrain_corpus", corpus_args(generic, passages, resumed))
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_spans_lie_inside_the_document_within_the_length_range():
    rng = np.random.default_rng(3)
    ids = list(range(100, 150))
    for _ in range(200):
        spans = sample_spans(rng, ids, 5, 20)
        assert len(spans) == 2
        for span in spans:
            assert 5 <= len(span) <= 20
            start = ids.index(span[0])
            assert ids[start : start + len(span)] == span


def test_wordpiece_word_ids():
    assert wordpiece_word_ids(["the", "aero", "##foil", "lift", "##s"]) == [0, 1, 1, 2, 2]
