"""Query-as-context pre-training inputs (query-as-context §3.2): a passage paired with one of the
queries doc2query generated for it, instead of two passages (spans) of the same document.

For coCondenser the (passage, query) pair is the contrastive positive pair; for CoT-MAE the
passage goes to the encoder and the query to the decoder. A passage has C candidate queries; the
candidate used in epoch ``e`` is ``(offset(passage) + e) mod C``, with a per-passage offset drawn
from a hash of the passage id and the seed, so a passage gets a different candidate in each of
its first C epochs and the choice is a pure function of (seed, passage, epoch): resume-safe and
the same on every process. A passage is only ever paired with its own queries.

Passages with no generated query (doc2query was run on a subset, or every candidate was empty)
are skipped and counted.

With a token store of the passages (view ``passages``, :mod:`dprflow.data.token_store`) the items
are :class:`QacItems`: a passage's tokens are read from the store when its batch is built, and the
generated queries are tokenized once into a token store of their own (streamed, memory-mapped);
the same items, in the same order, as the in-memory path.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dprflow.data.ids import IdIndex
from dprflow.data.schemas import read_table
from dprflow.errors import StageError

log = logging.getLogger(__name__)


class QacItem(NamedTuple):
    """A passage's token ids (no special tokens) and the token ids of its candidate queries."""

    passage_id: str
    passage: np.ndarray
    queries: tuple[np.ndarray, ...]


def candidate_index(passage_id: str, epoch: int, n_candidates: int, seed: int) -> int:
    """The candidate query of ``passage_id`` in ``epoch`` (see the module docstring)."""
    digest = hashlib.blake2b(f"{seed}\0{passage_id}".encode(), digest_size=8).digest()
    offset = int.from_bytes(digest, "little") % n_candidates
    return (offset + epoch) % n_candidates


class QacItems(Sequence):
    """Query-as-context items read lazily: passage ``rows[i]`` of the store, cut to ``max_tokens``,
    its id ``passage_ids[i]`` (an Arrow string array), with the queries ``first[i]..first[i + 1] - 1``
    of ``queries`` (a token store of the generated queries, ordered by passage and query index)."""

    def __init__(self, store, rows, max_tokens, passage_ids, queries, first) -> None:
        self.store, self.rows, self.max_tokens = store, rows, max_tokens
        self.passage_ids, self.queries, self.first = passage_ids, queries, first

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> QacItem:
        ids = self.store[int(self.rows[i])][: self.max_tokens]
        queries = tuple(self.queries[q] for q in range(int(self.first[i]), int(self.first[i + 1])))
        return QacItem(self.passage_ids[i].as_py(), ids, queries)


def read_items(
    passages_path: str,
    queries_path: str,
    tokenizer,
    max_passage_tokens: int,
    max_query_tokens: int,
    store=None,
    scratch: str | Path | None = None,
    batch: int = 4096,
) -> tuple[list[QacItem], dict[str, int]]:
    """Tokenized (passage, candidate queries) items, in passage order, and the counts of what was
    kept; with ``store`` (the passages' token store, view ``passages``) lazy :class:`QacItems`,
    the generated queries tokenized into a token store in ``scratch`` (a folder the caller removes
    when training ends; default: a temporary folder removed once the store is open, its memory
    maps staying valid), ``batch`` generated queries read and tokenized at a time."""
    if store is not None:
        with contextlib.ExitStack() as stack:
            if scratch is None:
                scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="qac-queries."))
            return _store_items(
                passages_path,
                queries_path,
                tokenizer,
                max_passage_tokens,
                max_query_tokens,
                store,
                scratch,
                batch,
            )
    passages = read_table(passages_path, "passages")
    generated = read_table(queries_path, "generated_queries")
    unknown = sorted(set(generated["passage_id"]) - set(passages["passage_id"]))
    if unknown:
        raise StageError(
            f"{queries_path}: {len(unknown)} passage ids not in {passages_path}, e.g. {unknown[:3]}"
        )
    generated = generated[generated["text"].str.strip() != ""].sort_values(["passage_id", "query_index"])
    by_passage = generated.groupby("passage_id", sort=False)["text"].agg(list)
    kept = passages[passages["passage_id"].isin(by_passage.index)]
    texts = kept["title"].str.cat(kept["text"], sep=" ").str.strip().tolist()
    p_ids = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=max_passage_tokens)[
        "input_ids"
    ]
    items = []
    for pid, ids in zip(kept["passage_id"], p_ids, strict=True):
        q_ids = tokenizer(
            by_passage[pid], add_special_tokens=False, truncation=True, max_length=max_query_tokens
        )
        queries = tuple(np.asarray(q, dtype=np.int64) for q in q_ids["input_ids"] if q)
        if queries and ids:
            items.append(QacItem(pid, np.asarray(ids, dtype=np.int64), queries))
    return items, _counts(
        len(passages), len(items), sum(len(it.queries) for it in items), passages_path, queries_path
    )


def _counts(
    n_passages: int, n_items: int, n_queries: int, passages_path: str, queries_path: str
) -> dict[str, int]:
    counts = {
        "passages": n_passages,
        "passages_without_generated_query_skipped": n_passages - n_items,
        "generated_queries": int(n_queries),
        "training_passages": n_items,
    }
    for key, value in counts.items():
        log.info("query-as-context %s: %d", key, value)
    if not n_items:
        raise StageError(f"{queries_path}: no passage of {passages_path} has a generated query")
    return counts


# query_index is packed under the passage row in one int64 sort key
QUERY_INDEX_BITS = 20


def _store_items(
    passages_path, queries_path, tokenizer, max_passage_tokens, max_query_tokens, store, scratch, batch=4096
):
    """:func:`read_items` over a token store. The generated queries are streamed ``batch`` rows at
    a time, their passage rows found by :class:`IdIndex`, and their tokens written to a token
    store (view ``generated-queries``) in ``scratch``, reordered by (passage row, query index)
    when the table is not in that order. Resident: the passage ids (Arrow strings) and their
    index, 8 bytes a query while the queries are read, then 16 bytes a passage with queries."""
    import array

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dprflow.data.token_store import TokenStoreWriter, reorder
    from dprflow.pretraining.documents import passage_batches

    pids = pq.read_table(passages_path, columns=["passage_id"])["passage_id"].combine_chunks()
    if len(pids) != len(store):
        raise StageError(
            f"{store.path}: {len(store)} passages, {passages_path} has {len(pids)}; tokenize it again"
        )
    index = IdIndex(pids)
    keys, unknown = array.array("q"), set()
    out = Path(scratch) / "generated-queries"
    with TokenStoreWriter(out, tokenizer, "generated-queries", {"path": str(queries_path)}) as writer:
        columns = ["passage_id", "query_index", "text"]
        for frame in passage_batches(queries_path, columns, rows=batch, table="generated_queries"):
            rows = index.rows(pa.array(frame["passage_id"], pa.string()))
            if (rows < 0).any():
                unknown.update(frame["passage_id"][rows < 0])
            if unknown:
                continue  # read on, to name every unknown id
            qi = frame["query_index"].to_numpy(dtype=np.int64)
            if ((qi < 0) | (qi >= 1 << QUERY_INDEX_BITS)).any():
                raise StageError(f"{queries_path}: query_index outside 0..{(1 << QUERY_INDEX_BITS) - 1}")
            text = frame["text"]
            blank = (text.str.strip() == "").to_numpy()
            encoded = tokenizer(
                text[~blank].tolist(), add_special_tokens=False, truncation=True, max_length=max_query_tokens
            )["input_ids"]
            rows, qi = rows[~blank], qi[~blank]
            # a candidate is a non-empty query of a passage with a non-empty text (the in-memory rule)
            keep = (np.fromiter(map(len, encoded), np.int64, len(encoded)) > 0) & (
                store.offsets[rows + 1] - store.offsets[rows] > 0
            )
            writer.extend([ids for ids, k in zip(encoded, keep, strict=True) if k])
            keys.frombytes((rows[keep] << QUERY_INDEX_BITS | qi[keep]).astype(np.int64).tobytes())
        if unknown:
            raise StageError(
                f"{queries_path}: {len(unknown)} passage ids not in {passages_path}, e.g. {sorted(unknown)[:3]}"
            )
        queries = writer.close()
    keys = np.frombuffer(keys, np.int64)
    if (keys[1:] < keys[:-1]).any():  # the in-memory path's stable sort by (row, query_index)
        order = np.argsort(keys, kind="stable")
        unsorted = queries
        queries = reorder(unsorted, order, Path(scratch) / "generated-queries-sorted", tokenizer)
        shutil.rmtree(unsorted.path)  # its memory maps close with the object
        keys = keys[order]
        del order
    rows = keys >> QUERY_INDEX_BITS
    del keys
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if len(rows) else np.zeros(0, np.int64)
    unique = rows[first]  # passages in table order
    n_queries = len(rows)
    del rows
    bounds = np.append(first, n_queries)
    items = QacItems(store, unique, max_passage_tokens, pids.take(unique), queries, bounds)
    counts = _counts(len(pids), len(items), n_queries, passages_path, queries_path)
    return items, counts


def pairs(items: list[QacItem], epoch: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The passages and the query each is paired with in ``epoch``."""
    chosen = [it.queries[candidate_index(it.passage_id, epoch, len(it.queries), seed)] for it in items]
    return [it.passage for it in items], chosen
