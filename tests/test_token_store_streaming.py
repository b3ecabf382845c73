"""What stays resident when CoT-MAE and query-as-context read a token store (docs/scale.md,
"Token store and streamed pre-training data"): CoT-MAE's spans are cut block by block and
memory-mapped, the generated queries are tokenized into a token store of their own; the items,
and so the batches, stay those of the in-memory path for the same seed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from token_store_helpers import SEED, assert_same_batches, reference_cotmae_texts

from dprflow.data.schemas import read_table, write_table
from dprflow.data.token_store import TokenStore, TokenStoreWriter
from dprflow.errors import StageError
from dprflow.pretraining.condenser.data import mlm_batch
from dprflow.pretraining.documents import tokenize_view
from dprflow.pretraining.mae.data import cotmae_documents, mae_batch, pair_mae_batch, store_cotmae_documents
from dprflow.pretraining.query_as_context import pairs as query_context


def test_cotmae_spans_cut_in_blocks_and_memory_mapped(data, tok, tmp_path):
    path = data / "passages.parquet"
    old, old_counts = cotmae_documents(
        reference_cotmae_texts(path), tok, np.random.default_rng([SEED, 2]), 4, 16
    )
    store = tokenize_view("document-sentences", tmp_path / "s", tok, path, batch_texts=3)
    scratch = tmp_path / "scratch"
    # blocks of 4 documents: the sentence lengths of each block come from the memory map
    new, counts = store_cotmae_documents(store, np.random.default_rng([SEED, 2]), 4, 16, scratch, block=4)
    assert counts == old_counts and len(old) > 8
    assert isinstance(new.spans, np.memmap) and new.spans.dtype == np.int64
    assert list(scratch.iterdir()) == []  # an unnamed file: nothing is left behind
    assert new.docs.nbytes + new.span_offsets.nbytes == 8 * (2 * len(new) + 1)
    assert [[x.tolist() for x in doc] for doc in new] == [[x.tolist() for x in doc] for doc in old]

    def make(rng, docs):
        return mae_batch("cotmae", docs, tok, rng, p_enc=0.3, p_dec=0.45, span_max=16, context="mixed")

    assert_same_batches(old, new, make)


@pytest.fixture
def shuffled_queries(data, tmp_path):
    """The generated queries in another row order than (passage, query_index)."""
    table = read_table(data / "generated_queries.parquet", "generated_queries")
    shuffled = table.sample(frac=1.0, random_state=3).reset_index(drop=True)
    assert not shuffled.equals(table)
    path = tmp_path / "shuffled.parquet"
    write_table(shuffled, path, "generated_queries")
    return path


@pytest.mark.parametrize("order", ["table", "shuffled"])
def test_query_as_context_queries_come_from_a_token_store(data, tok, tmp_path, shuffled_queries, order):
    queries = data / "generated_queries.parquet" if order == "table" else shuffled_queries
    args = (str(data / "passages.parquet"), str(queries), tok, 12, 6)
    old, old_counts = query_context.read_items(*args)
    store = tokenize_view("passages", tmp_path / "p", tok, data / "passages.parquet")
    scratch = tmp_path / "scratch"
    new, counts = query_context.read_items(*args, store, scratch, batch=7)
    assert counts == old_counts and len(old) > 8
    assert isinstance(new.queries, TokenStore) and new.queries.meta["view"] == "generated-queries"
    assert len(new.queries) == counts["generated_queries"]
    # shuffled: the store written in table order was reordered by (passage, query_index) and removed
    kept = "generated-queries" if order == "table" else "generated-queries-sorted"
    assert sorted(p.name for p in scratch.iterdir()) == [kept]
    assert [as_lists(item) for item in new] == [as_lists(item) for item in old]
    for kind in ("cocondenser", "mae"):
        assert_same_batches(old, new, qac_batches(tok, kind), steps=8)


def as_lists(item):
    return item.passage_id, item.passage.tolist(), [q.tolist() for q in item.queries]


def qac_batches(tokenizer, kind):
    """A stage's make_batch: coCondenser rows 2i, 2i + 1 (passage, query); MAE passage -> query."""

    def make(rng, items, epoch):
        passages, chosen = query_context.pairs(items, epoch, SEED)
        if kind == "mae":
            return pair_mae_batch(passages, chosen, tokenizer, rng, p_enc=0.3, p_dec=0.45)
        return mlm_batch([row for pair in zip(passages, chosen, strict=True) for row in pair], tokenizer, rng)

    return make


def test_query_as_context_store_path_names_unknown_passages(data, tok, tmp_path):
    table = read_table(data / "generated_queries.parquet", "generated_queries")
    extra = pd.DataFrame(
        [("nope#0", 0, "a query"), ("nope#1", 1, "another"), ("nope#0", 2, "again")],
        columns=["passage_id", "query_index", "text"],
    )
    path = tmp_path / "g.parquet"
    write_table(pd.concat([table, extra], ignore_index=True), path, "generated_queries")
    store = tokenize_view("passages", tmp_path / "p", tok, data / "passages.parquet")
    with pytest.raises(StageError, match=r"2 passage ids not in .*\['nope#0', 'nope#1'\]"):
        query_context.read_items(str(data / "passages.parquet"), str(path), tok, 12, 6, store, batch=5)


def test_id_index_finds_rows_and_only_known_ids():
    ids = pa.array(["b#1", "a#0", "ccc#12", "a#1", "é#0"])
    index = query_context.IdIndex(ids, block=2)
    assert index.width == 6 and index.sorted.dtype == np.dtype("S6")
    probe = pa.array(["a#1", "ccc#12", "zz", "ccc#123", "é#0", "", "a#0", "b#1"])
    assert index.rows(probe).tolist() == [3, 2, -1, -1, 4, -1, 1, 0]
    assert query_context.IdIndex(pa.array([], pa.string())).rows(pa.array(["a"])).tolist() == [-1]


def test_writer_extend_writes_what_add_writes(tok, tmp_path):
    docs = [[5, 6, 7], [], [9, 65535], [1]]
    with TokenStoreWriter(tmp_path / "one", tok, "texts") as one:
        for ids in docs:
            one.add(ids)
    with TokenStoreWriter(tmp_path / "many", tok, "texts") as many:
        many.extend(docs[:2])
        many.extend([])
        many.extend(docs[2:])
    assert many.store.offsets.tolist() == one.store.offsets.tolist() == [0, 3, 3, 5, 6]
    assert many.store.tokens.tolist() == one.store.tokens.tolist()
    assert many.store.meta["documents"] == 4 and many.store.meta["tokens"] == 6
    with (
        pytest.raises(ValueError, match="outside 0..65535"),
        TokenStoreWriter(tmp_path / "x", tok, "texts") as w,
    ):
        w.extend([[1], [70000]])
