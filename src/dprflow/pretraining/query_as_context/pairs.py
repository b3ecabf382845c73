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
queries' tokens sit in one flat array; the same items, in the same order, as the in-memory path.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from dprflow.cli import StageError
from dprflow.data.schemas import read_table

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
    its id ``passage_ids[i]`` (an Arrow string array), with queries ``first[i]..first[i + 1] - 1``
    (their tokens ``query_tokens[query_offsets[q]:query_offsets[q + 1]]``)."""

    def __init__(self, store, rows, max_tokens, passage_ids, query_tokens, query_offsets, first) -> None:
        self.store, self.rows, self.max_tokens = store, rows, max_tokens
        self.passage_ids, self.query_tokens = passage_ids, query_tokens
        self.query_offsets, self.first = query_offsets, first

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> QacItem:
        ids = self.store[int(self.rows[i])][: self.max_tokens]
        bounds = self.query_offsets[self.first[i] : self.first[i + 1] + 1]
        queries = tuple(
            self.query_tokens[a:b].astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        )
        return QacItem(self.passage_ids[i].as_py(), ids, queries)


def read_items(
    passages_path: str,
    queries_path: str,
    tokenizer,
    max_passage_tokens: int,
    max_query_tokens: int,
    store=None,
) -> tuple[list[QacItem], dict[str, int]]:
    """Tokenized (passage, candidate queries) items, in passage order, and the counts of what was
    kept; with ``store`` (the passages' token store, view ``passages``) lazy :class:`QacItems`."""
    if store is not None:
        return _store_items(
            passages_path, queries_path, tokenizer, max_passage_tokens, max_query_tokens, store
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


def _store_items(
    passages_path, queries_path, tokenizer, max_passage_tokens, max_query_tokens, store, batch=4096
):
    """:func:`read_items` over a token store: only the passage ids (Arrow strings) and the
    generated queries are read; a query's passage row is found by Arrow's ``index_in``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pids = pq.read_table(passages_path, columns=["passage_id"])["passage_id"].combine_chunks()
    if len(pids) != len(store):
        raise StageError(
            f"{store.path}: {len(store)} passages, {passages_path} has {len(pids)}; tokenize it again"
        )
    generated = read_table(queries_path, "generated_queries")
    rows = pc.index_in(pa.array(generated["passage_id"], pa.string()), value_set=pids)
    if rows.null_count:
        unknown = sorted(set(generated["passage_id"][rows.is_null().to_numpy(zero_copy_only=False)]))
        raise StageError(
            f"{queries_path}: {len(unknown)} passage ids not in {passages_path}, e.g. {unknown[:3]}"
        )
    generated = generated.assign(row=rows.to_numpy(zero_copy_only=False))
    generated = generated[generated["text"].str.strip() != ""]
    generated = generated.sort_values(["row", "query_index"], kind="stable")
    texts = generated["text"].tolist()
    tokens = []
    for start in range(0, len(texts), batch):
        encoded = tokenizer(
            texts[start : start + batch],
            add_special_tokens=False,
            truncation=True,
            max_length=max_query_tokens,
        )["input_ids"]
        tokens.extend(np.asarray(q, dtype=np.int32) for q in encoded)
    rows = generated["row"].to_numpy(dtype=np.int64)
    del texts, generated
    lengths = np.asarray([len(t) for t in tokens], dtype=np.int64)
    # a candidate is a non-empty query of a passage with a non-empty text (the in-memory rule)
    keep = (lengths > 0) & (store.lengths[rows] > 0)
    flat = np.concatenate([t for t, k in zip(tokens, keep, strict=True) if k] or [np.zeros(0, np.int32)])
    del tokens
    rows = rows[keep]
    offsets = np.concatenate([[0], np.cumsum(lengths[keep])])
    unique, first = np.unique(rows, return_index=True)  # passages in table order, their first query
    bounds = np.append(first, len(rows))
    items = QacItems(store, unique, max_passage_tokens, pids.take(unique), flat, offsets, bounds)
    counts = _counts(len(pids), len(items), len(rows), passages_path, queries_path)
    return items, counts


def pairs(items: list[QacItem], epoch: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The passages and the query each is paired with in ``epoch``."""
    chosen = [it.queries[candidate_index(it.passage_id, epoch, len(it.queries), seed)] for it in items]
    return [it.passage for it in items], chosen
