"""Pre-training corpora: the generic corpus and the collection's documents as token sequences.

Every pre-training method reads its text through here; what each method cuts from it (spans,
crops, chunks) lives in the method's own folder.

Generic corpus (stages ``pretrain_generic`` and ``pretrain_mae_generic``; the papers use Wikipedia
and BookCorpus):

- ``pydoc``: the default, offline. The Python language and library reference topics that every
  CPython installation ships (``pydoc_data.topics``, about 65,000 words of English prose), one
  document per topic. Different text from the ``stdlib`` collection (the docstrings).
- ``jsonl``: a file of ``{"text": ...}`` lines (a dump of Wikipedia or BookCorpus, for real runs).
- ``passages``: a ``passages.parquet`` table.

MLM chunks: each document is tokenized once (no special tokens) and cut into consecutive chunks
of ``max_length - 2`` tokens (:func:`chunk_tokens`).

Collection documents (corpus-stage pre-training): a document is the token sequence of its
passages' texts in order (:func:`read_passages_documents`). Documents shorter than the minimum a
method needs are skipped and counted.

The token store (:mod:`dprflow.data.token_store`): stage ``pretrain_tokenize`` tokenizes a corpus once per
tokenizer and *view* (:data:`VIEWS`, what a document is) by streaming its texts
(:func:`view_texts`) in batches into a memory-mapped store (:func:`tokenize_view`); the methods cut
their batches from it lazily. The in-memory functions above are the reference the store path is
tested against (``tests/test_token_store.py``: the same seed gives the same batches).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dprflow.errors import StageError

log = logging.getLogger(__name__)

GENERIC_SOURCES = ("pydoc", "jsonl", "passages")


@dataclass(kw_only=True)
class CorpusArgs:
    """The command-line fields of a stage that reads a corpus of texts: the generic corpus
    (``pretrain.generic_corpus``) or a collection's passages. A stage that needs one checks it
    with :meth:`check_corpus`."""

    corpus: str | None = field(
        default=None,
        metadata={
            "help": "where the texts come from: pydoc (the installed Python's documentation), jsonl "
            "(a JSON-lines file of texts) or passages (a passages.parquet); the last two with --corpus-path",
            "choices": list(GENERIC_SOURCES),
        },
    )
    corpus_path: str | None = field(default=None, metadata={"help": "the file of --corpus jsonl or passages"})

    def check_corpus(self) -> None:
        if self.corpus is None:
            raise ValueError("give --corpus")


def generic_texts(source: str, path: str | None = None) -> list[str]:
    """The documents of a generic pre-training corpus (see the module docstring)."""
    return list(iter_generic_texts(source, path))


def iter_generic_texts(
    source: str, path: str | None = None, start: int = 0, stop: int | None = None
) -> Iterator[str]:
    """The texts ``start..stop-1`` of a generic corpus, read one batch at a time (jsonl: a line;
    passages: a Parquet record batch), so that a pass over the corpus never holds all of it."""
    if source not in GENERIC_SOURCES:
        raise StageError(f"unknown generic corpus source {source!r}; allowed: {', '.join(GENERIC_SOURCES)}")
    if source != "pydoc" and not path:
        raise StageError(
            f"generic corpus {source!r} needs a path"
            + (" to a passages.parquet" if source == "passages" else "")
        )
    first = 0  # the index of the first text read
    if source == "pydoc":
        import pydoc_data.topics

        topics = pydoc_data.topics.topics
        texts: Iterator[str] = (topics[key] for key in sorted(topics))
    elif source == "passages":
        # whole row groups before ``start`` are not read (a shard reads its own rows)
        first = _first_row_of_groups(path, start)
        texts = (
            text
            for batch in passage_batches(path, ["title", "text"], skip_rows=first)
            for text in batch["title"].str.cat(batch["text"], sep=" ").str.strip()
        )
    else:
        texts = _jsonl_texts(path)
    for i, text in enumerate(texts, start=first):
        if stop is not None and i >= stop:
            return
        if i >= start:
            yield text


def open_parquet(path: str | Path, **options):
    """``pyarrow.parquet.ParquetFile(path)``; a file pyarrow cannot read (cut short by a copy or a
    job that did not finish, a full disk) is a :class:`StageError` naming it and how to rebuild
    it, where pyarrow said only "Parquet magic bytes not found in footer"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path, **options)
    except pa.ArrowException as exc:
        raise damaged_parquet(path, exc) from exc


def damaged_parquet(path: str | Path, exc: Exception) -> StageError:
    return StageError(
        f"{path}: damaged Parquet file, truncated or overwritten ({exc}); delete it and rebuild it: "
        "a passages.parquet under results/ is rebuilt by running the workflow again (its "
        "split_passages job), a corpus given as pretrain.generic_corpus.path must be written again"
    )


def _first_row_of_groups(path: str, start: int) -> int:
    """The first row of the Parquet row group that holds row ``start``."""
    if not Path(path).exists():
        return 0
    meta, first = open_parquet(path).metadata, 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        if first + rows > start:
            break
        first += rows
    return first


def _jsonl_texts(path: str) -> Iterator[str]:
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                record = json.loads(raw.decode("utf-8"))
                text = str(record["text"])
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
                raise StageError(
                    f"{path}:{number}: expected a JSON object with a 'text' field ({exc})"
                ) from exc
            yield text


def count_generic_texts(source: str, path: str | None = None) -> int:
    """How many texts a generic corpus holds, without reading them (Parquet: its metadata)."""
    if source == "passages" and path:
        return open_parquet(path).metadata.num_rows
    return sum(1 for _ in iter_generic_texts(source, path))


def passage_batches(
    path: str | Path, columns: list[str], rows: int = 8192, skip_rows: int = 0, table: str = "passages"
) -> Iterator[pd.DataFrame]:
    """``columns`` of a passages table (or another ``table`` of :mod:`dprflow.data.schemas`),
    ``rows`` at a time, in table order (checked against the schema the way
    :func:`dprflow.data.schemas.read_table` checks it), from the row group that starts at
    ``skip_rows`` (a row group boundary)."""
    import pyarrow as pa

    from dprflow.data.schemas import SchemaError, schema

    if not Path(path).exists():
        raise FileNotFoundError(f"{path}: no such table (expected a {table!r} table)")
    target = schema(table)
    # No pre-buffering (pyarrow's default): with it the reader keeps every column chunk it read
    # until the file is done, ~200 B a passage (pretrain_tokenize at 1M passages: 174 -> 371 MB
    # anonymous over the pass, flat at 113 MB without; apache/arrow#39808 is the same pattern).
    parquet = open_parquet(path, pre_buffer=False)
    for name in columns:
        if name not in parquet.schema_arrow.names:
            raise SchemaError(
                f"{path}: table {table!r} lacks column {name!r}; has {parquet.schema_arrow.names}"
            )
        if not pa_string_like(parquet.schema_arrow.field(name).type, target.field(name).type):
            raise SchemaError(f"{path}: column {name!r} has type {parquet.schema_arrow.field(name).type}")
    groups, first = [], 0
    for group in range(parquet.metadata.num_row_groups):
        if first >= skip_rows:
            groups.append(group)
        first += parquet.metadata.row_group(group).num_rows
    batches = parquet.iter_batches(batch_size=rows, columns=columns, row_groups=groups)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except pa.ArrowException as exc:  # a page overwritten inside an intact footer
            raise damaged_parquet(path, exc) from exc
        yield batch.to_pandas()


def pa_string_like(got, expected) -> bool:
    import pyarrow as pa

    return got.equals(expected) or (pa.types.is_string(expected) and pa.types.is_large_string(got))


def tokenize_documents(texts: Sequence[str], tokenizer) -> list[list[int]]:
    return tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]


def chunk_tokens(docs: Sequence[Sequence[int]], length: int, min_length: int = 8) -> list[list[int]]:
    """Consecutive chunks of at most ``length`` tokens; trailing chunks shorter than ``min_length`` are dropped."""
    chunks = []
    for ids in docs:
        for start in range(0, len(ids), length):
            piece = list(ids[start : start + length])
            if len(piece) >= min_length:
                chunks.append(piece)
    return chunks


def document_tokens(passages: pd.DataFrame, tokenizer) -> tuple[list[list[int]], int]:
    """Token ids of each document (its passages' texts in order) and the number of documents."""
    ordered = passages.sort_values(["doc_id", "position"], kind="stable")
    texts = ordered.groupby("doc_id", sort=True)["text"].agg(" ".join)
    return tokenize_documents(texts.tolist(), tokenizer), len(texts)


def read_passages_documents(
    path: str | Path, tokenizer, span_min: int
) -> tuple[list[list[int]], dict[str, int]]:
    from dprflow.data.schemas import read_table

    docs, n = document_tokens(read_table(path, "passages"), tokenizer)
    kept = [d for d in docs if len(d) >= span_min]
    counts = {"documents": n, "documents_too_short_skipped": n - len(kept), "documents_kept": len(kept)}
    for key, value in counts.items():
        log.info("span documents, %s: %d", key, value)
    if len(kept) < 2:
        raise StageError(f"{path}: fewer than 2 documents have {span_min} tokens or more: {counts}")
    return kept, counts


# What a document of a token store is (the ``{view}`` of ``results/<corpus>/tokens/<tokenizer>/<view>``).
VIEWS = {
    "documents": "a collection's documents: the text of its passages joined by ' ' in position order, "
    "ordered by doc_id (coCondenser stage two, Contriever)",
    "passages": "title + ' ' + text of each passage, in table order (BMAE/CDMAE corpus stage, "
    "query-as-context passages)",
    "document-sentences": "a collection's documents, its passages' title + text joined, ordered by doc_id, "
    "tokenized sentence by sentence (CoT-MAE corpus stage)",
    "texts": "the texts of the generic corpus (Condenser, BMAE/CDMAE generic stage)",
    "text-sentences": "the texts of the generic corpus tokenized sentence by sentence (CoT-MAE generic stage)",
}


def check_view(view: str) -> str:
    if view not in VIEWS:
        raise ValueError(f"unknown token store view {view!r}; allowed: {', '.join(VIEWS)}")
    return view


def passage_documents(path: str | Path, titled: bool) -> Iterator[tuple[str, str]]:
    """``(doc_id, text)`` of each document of a passages table, in table order, streamed: its
    passages' texts (``titled``: title + text, each stripped) joined by ' '. A document's
    passages must be contiguous rows in position order (as ``split_passages`` writes them)."""
    doc, parts, last = None, [], -1
    for batch in passage_batches(path, ["doc_id", "position", "title", "text"]):
        pieces = batch["title"].str.cat(batch["text"], sep=" ").str.strip() if titled else batch["text"]
        for doc_id, position, piece in zip(batch["doc_id"], batch["position"], pieces, strict=True):
            if doc_id != doc:
                if doc is not None:
                    yield doc, " ".join(parts)
                doc, parts = doc_id, []
            elif position <= last:
                raise StageError(
                    f"{path}: passages of document {doc_id!r} are not in position order "
                    f"({position} after {last}); write the table with split_passages"
                )
            parts.append(piece)
            last = position
    if doc is not None:
        yield doc, " ".join(parts)


def view_texts(
    view: str, path: str | Path | None = None, source: str = "passages"
) -> tuple[Iterator[str], list]:
    """The texts of a view, streamed, and a list that holds the documents' ``doc_id``s (Arrow
    string arrays) once the iterator is exhausted (document views only; their store is then
    reordered by doc_id)."""
    check_view(view)
    ids: list = []
    if view in ("texts", "text-sentences"):
        return iter_generic_texts(source, None if path is None else str(path)), ids
    if view == "passages":
        return iter_generic_texts("passages", str(path)), ids

    def texts() -> Iterator[str]:
        import pyarrow as pa

        pending = []  # doc_ids as Arrow strings, 65,536 at a time (not a Python str each)
        for doc_id, text in passage_documents(path, titled=view == "document-sentences"):
            pending.append(doc_id)
            if len(pending) == 1 << 16:
                ids.append(pa.array(pending, pa.string()))
                pending = []
            yield text
        ids.append(pa.array(pending, pa.string()))

    return texts(), ids


def tokenize_view(
    view: str,
    out: str | Path,
    tokenizer,
    path: str | Path | None = None,
    source: str = "passages",
    stats=None,
    batch_texts: int = 1024,
):
    """Tokenize a view of a corpus into a token store at ``out`` (:mod:`dprflow.data.token_store`),
    ``batch_texts`` texts at a time, exactly as the in-memory path tokenizes them (no special
    tokens, no truncation; sentence views as :func:`dprflow.pretraining.mae.data.tokenize_sentences`;
    with n-gram ``stats``, each token's importance as
    :func:`dprflow.pretraining.mae.data.tokenize_with_importance`). Document views are written in
    table order, then reordered by doc_id (the in-memory path's ``groupby(sort=True)``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from dprflow.data.token_store import TokenStoreWriter, reorder

    texts, doc_ids = view_texts(view, path, source)
    documents = view in ("documents", "document-sentences")
    out = Path(out)
    target = out.with_name(f".{out.name}.table-order") if documents else out
    meta = {"source": source if view in ("texts", "text-sentences") else "passages", "path": str(path or "")}
    with TokenStoreWriter(target, tokenizer, view, meta) as writer:
        batch: list[str] = []

        def flush() -> None:
            if view.endswith("sentences"):
                from dprflow.pretraining.mae.data import tokenize_sentences  # imports torch

                for ids, sentences in tokenize_sentences(batch, tokenizer):
                    writer.add(ids, sentences=sentences)
            elif stats is not None:
                from dprflow.pretraining.mae.data import tokenize_with_importance

                for text in tokenize_with_importance(batch, tokenizer, stats):
                    writer.add(text.ids, importance=text.importance)
            else:
                for ids in tokenizer(batch, add_special_tokens=False, truncation=False)["input_ids"]:
                    writer.add(ids)
            batch.clear()

        for text in texts:
            batch.append(text)
            if len(batch) == batch_texts:
                flush()
        if batch:
            flush()
        store = writer.close()
    if not documents:
        return store
    try:
        keys = pa.chunked_array(doc_ids, pa.string()).combine_chunks()
        del doc_ids[:]
        order = pc.sort_indices(keys).to_numpy()
        ordered = keys.take(order)
        repeated = pc.equal(ordered[1:], ordered[:-1]).to_numpy(zero_copy_only=False)
        if repeated.any():
            raise StageError(
                f"{path}: the passages of document {ordered[int(np.argmax(repeated))].as_py()!r} are not "
                "contiguous rows; write the table with split_passages"
            )
        return reorder(store, order, out, tokenizer)
    finally:
        shutil.rmtree(target, ignore_errors=True)


def open_or_tokenize(
    tokens: str | None,
    view: str,
    tokenizer,
    scratch: str | Path,
    path=None,
    source: str = "passages",
    stats=None,
):
    """The token store a stage reads: ``tokens`` (stage ``pretrain_tokenize``'s output, checked against the
    view and the tokenizer), else the view tokenized now into ``scratch`` (a stage run on its own).
    ``stats`` (CDMAE's importance) always tokenizes now: importance depends on the n-gram counts."""
    from dprflow.data.token_store import TokenStore

    if tokens and stats is None:
        store = TokenStore(tokens).check(view, tokenizer)
        log.info("token store %s: %d documents, %d tokens", tokens, len(store), store.n_tokens)
        return store
    store = tokenize_view(view, Path(scratch) / view, tokenizer, path, source, stats)
    log.info("tokenized %s into %s: %d documents, %d tokens", view, scratch, len(store), store.n_tokens)
    return store


def store_documents(store, min_length: int, where: str):
    """The documents of a store with at least ``min_length`` tokens, lazily (lists of ints), and
    the counts :func:`read_passages_documents` gives."""
    from dprflow.data.token_store import Ranges, document_ranges

    starts, stops = document_ranges(store, min_length)
    n = len(store)
    counts = {"documents": n, "documents_too_short_skipped": n - len(starts), "documents_kept": len(starts)}
    for key, value in counts.items():
        log.info("span documents, %s: %d", key, value)
    if len(starts) < 2:
        raise StageError(f"{where}: fewer than 2 documents have {min_length} tokens or more: {counts}")
    return Ranges(store, starts, stops), counts
