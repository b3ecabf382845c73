"""Method mlm (issue 54): stage pretrain_mlm with --init continues a model's masked language model
on a collection's documents. It starts from the model's weights (a fresh MLM head where it ships
none), lowers the held-out masked-token loss, keeps the model's sentence-transformers geometry (or
the one given), and the card cites domain-adaptive pre-training, not the MLM base."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import save_tiny_bert
from transformers import AutoModel

from dprflow.data.schemas import write_table
from dprflow.models.st_format import read_st_settings, write_st_files
from dprflow.stages import pretrain_mlm

WORDS = "wing lift flow boundary layer heat plate shock pressure drag airfoil speed".split()


@pytest.fixture(scope="module")
def st_init(tmp_path_factory):
    """A tiny BERT saved as a sentence-transformers model in MiniLM's geometry (mean, cosine)."""
    out = save_tiny_bert(tmp_path_factory.mktemp("st_init"))
    write_st_files(out, "mean", "cosine", 32, 128)
    return out


@pytest.fixture(scope="module")
def passages(tmp_path_factory):
    """40 documents of two passages each, sentences of a small vocabulary."""
    rows = []
    for d in range(40):
        for position in range(2):
            words = [WORDS[(d * 7 + position * 3 + i) % len(WORDS)] for i in range(30)]
            rows.append((f"d{d}-{position}", f"d{d}", position, "", " ".join(words) + ".", 30))
    table = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"])
    path = tmp_path_factory.mktemp("collection") / "passages.parquet"
    write_table(table.astype({"position": "int32", "n_tokens": "int32"}), path, "passages")
    return path


def run(init, passages, out, *extra: str) -> int:
    argv = [
        "--init", str(init), "--view", "documents", "--corpus", "passages", "--corpus-path", str(passages),
        "--out", str(out / "model"), "--checkpoint-dir", str(out / "checkpoints"),
        "--max-length", "32", "--batch-size", "8", "--learning-rate", "3e-3", "--max-steps", "20",
        "--heldout-sequences", "16", "--warmup-ratio", "0.1", "--seed", "13", "--threads", "1", *extra,
    ]  # fmt: skip
    return pretrain_mlm.main(argv)


def test_continued_from_the_model_in_its_geometry(st_init, passages, tmp_path):
    assert run(st_init, passages, tmp_path) == 0
    model = tmp_path / "model"
    figures = json.loads((model / "mlm_eval.json").read_text())
    assert figures["loss"] < figures["loss_at_init"]
    args = json.loads((model / "training_args.json").read_text())
    assert args["method"] == "mlm" and args["init"] == str(st_init)
    # started from the model's weights, and trained
    start, trained = AutoModel.from_pretrained(st_init), AutoModel.from_pretrained(model)
    embeddings = "embeddings.word_embeddings.weight"
    assert torch.allclose(start.state_dict()[embeddings], trained.state_dict()[embeddings], atol=0.1)
    assert not torch.equal(start.state_dict()[embeddings], trained.state_dict()[embeddings])
    assert read_st_settings(model) == {"pooling": "mean", "similarity": "cosine"}
    card = (model / "README.md").read_text()
    assert "Gururangan" in card and "Devlin" not in card
    assert not list(tmp_path.glob(".model.*"))  # no staging or scratch folder left


def test_the_geometry_given_replaces_the_models(st_init, passages, tmp_path):
    assert run(st_init, passages, tmp_path, "--pooling", "cls", "--similarity", "dot") == 0
    assert read_st_settings(tmp_path / "model") == {"pooling": "cls", "similarity": "dot"}


def test_too_short_a_model_or_too_few_documents_are_refused_by_key(passages, tmp_path, capsys):
    short = save_tiny_bert(tmp_path / "short", positions=24)
    assert run(short, passages, tmp_path / "a") == 1
    assert "pretrain.mlm.max_length 32 is longer than the 24 positions" in capsys.readouterr().err
    assert (
        run(save_tiny_bert(tmp_path / "b_init"), passages, tmp_path / "b", "--heldout-sequences", "500") == 1
    )
    assert "(pretrain.mlm.heldout_sequences)" in capsys.readouterr().err
