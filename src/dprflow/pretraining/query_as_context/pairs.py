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
"""

from __future__ import annotations

import hashlib
import logging
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


def read_items(
    passages_path: str, queries_path: str, tokenizer, max_passage_tokens: int, max_query_tokens: int
) -> tuple[list[QacItem], dict[str, int]]:
    """Tokenized (passage, candidate queries) items, in passage order, and the counts of what was kept."""
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
    counts = {
        "passages": len(passages),
        "passages_without_generated_query_skipped": len(passages) - len(items),
        "generated_queries": int(sum(len(it.queries) for it in items)),
        "training_passages": len(items),
    }
    for key, value in counts.items():
        log.info("query-as-context %s: %d", key, value)
    if not items:
        raise StageError(f"{queries_path}: no passage of {passages_path} has a generated query")
    return items, counts


def pairs(items: list[QacItem], epoch: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The passages and the query each is paired with in ``epoch``."""
    chosen = [it.queries[candidate_index(it.passage_id, epoch, len(it.queries), seed)] for it in items]
    return [it.passage for it in items], chosen
