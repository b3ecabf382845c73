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
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dprflow.cli import StageError

log = logging.getLogger(__name__)

GENERIC_SOURCES = ("pydoc", "jsonl", "passages")


def generic_texts(source: str, path: str | None = None) -> list[str]:
    """The documents of a generic pre-training corpus (see the module docstring)."""
    if source == "pydoc":
        import pydoc_data.topics

        topics = pydoc_data.topics.topics
        return [topics[key] for key in sorted(topics)]
    if source == "passages":
        from dprflow.data.schemas import read_table

        if not path:
            raise StageError("generic corpus 'passages' needs a path to a passages.parquet")
        table = read_table(path, "passages")
        return (table["title"].str.cat(table["text"], sep=" ").str.strip()).tolist()
    if source == "jsonl":
        if not path:
            raise StageError("generic corpus 'jsonl' needs a path")
        texts = []
        with open(path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                try:
                    record = json.loads(raw.decode("utf-8"))
                    texts.append(str(record["text"]))
                except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise StageError(
                        f"{path}:{number}: expected a JSON object with a 'text' field ({exc})"
                    ) from exc
        return texts
    raise StageError(f"unknown generic corpus source {source!r}; allowed: {', '.join(GENERIC_SOURCES)}")


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


def read_generic_documents(
    source: str, path: str | None, tokenizer, min_tokens: int
) -> tuple[list[list[int]], dict[str, int]]:
    """The documents of a generic corpus (:func:`generic_texts`) as token ids, those shorter than
    ``min_tokens`` skipped and counted (as :func:`read_passages_documents`)."""
    docs = tokenize_documents(generic_texts(source, path), tokenizer)
    kept = [d for d in docs if len(d) >= min_tokens]
    counts = {
        "documents": len(docs),
        "documents_too_short_skipped": len(docs) - len(kept),
        "documents_kept": len(kept),
    }
    for key, value in counts.items():
        log.info("generic documents, %s: %d", key, value)
    return kept, counts
