"""Pre-training inputs: the generic corpus, token chunks for MLM, and span pairs of documents.

Generic corpus (stage ``pretrain_generic``; the papers use Wikipedia and BookCorpus):

- ``pydoc``: the default, offline. The Python language and library reference topics that every
  CPython installation ships (``pydoc_data.topics``, about 65,000 words of English prose), one
  document per topic. Different text from the ``stdlib`` collection (the docstrings).
- ``jsonl``: a file of ``{"text": ...}`` lines (a dump of Wikipedia or BookCorpus, for real runs).
- ``passages``: a ``passages.parquet`` table.

MLM chunks: each document is tokenized once (no special tokens) and cut into consecutive chunks
of ``max_length - 2`` tokens; a batch adds ``[CLS]``/``[SEP]``, pads, and masks.

Span pairs (stage ``pretrain_corpus``, coCondenser section 3.2): a document is the token sequence
of its passages' texts in order; each batch draws, per document, two spans of a random length in
``[span_min, span_max]`` (cut to the document) at random positions. Documents shorter than
``span_min`` tokens cannot give two spans of the minimum length and are skipped (counted).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dprflow.cli import StageError
from dprflow.masking import generator_from, mask_tokens, special_tokens_mask, word_ids_tensor

log = logging.getLogger(__name__)

GENERIC_SOURCES = ("pydoc", "jsonl", "passages")


def generic_texts(source: str, path: str | None = None) -> list[str]:
    """The documents of a generic pre-training corpus (see the module docstring)."""
    if source == "pydoc":
        import pydoc_data.topics

        topics = pydoc_data.topics.topics
        return [topics[key] for key in sorted(topics)]
    if source == "passages":
        from dprflow.schemas import read_table

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


def sample_spans(
    rng: np.random.Generator, ids: Sequence[int], span_min: int, span_max: int
) -> list[list[int]]:
    """Two random spans of one document (coCondenser section 3.2), each of length in [span_min, span_max]."""
    spans = []
    for _ in range(2):
        length = int(rng.integers(span_min, min(span_max, len(ids)) + 1))
        start = int(rng.integers(0, len(ids) - length + 1))
        spans.append(list(ids[start : start + length]))
    return spans


def wordpiece_word_ids(tokens: Sequence[str]) -> list[int]:
    """Word index of each WordPiece token: a new word starts at every token not prefixed by '##'."""
    word, out = -1, []
    for tok in tokens:
        if not tok.startswith("##"):
            word += 1
        out.append(word)
    return out


def mlm_batch(
    pieces: Sequence[Sequence[int]],
    tokenizer,
    rng: np.random.Generator,
    mlm_probability: float = 0.15,
    whole_word: bool = False,
) -> dict[str, torch.Tensor]:
    """``[CLS] piece [SEP]`` rows, padded, with BERT masking: input_ids, attention_mask, labels."""
    rows = [[tokenizer.cls_token_id, *p, tokenizer.sep_token_id] for p in pieces]
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
    special = special_tokens_mask(input_ids, attention_mask, tokenizer.all_special_ids)
    word_ids = None
    if whole_word:
        words = [[None, *wordpiece_word_ids(tokenizer.convert_ids_to_tokens(list(p))), None] for p in pieces]
        word_ids = word_ids_tensor(words, length)
    masked = mask_tokens(
        input_ids,
        special,
        tokenizer.mask_token_id,
        len(tokenizer),
        generator_from(rng),
        p=mlm_probability,
        whole_word=whole_word,
        word_ids=word_ids,
    )
    return {"input_ids": masked.input_ids, "attention_mask": attention_mask, "labels": masked.labels}


def pair_batch(
    docs: Sequence[Sequence[int]],
    tokenizer,
    rng: np.random.Generator,
    span_min: int,
    span_max: int,
    mlm_probability: float = 0.15,
    whole_word: bool = False,
) -> dict[str, torch.Tensor]:
    """Rows ``2i`` and ``2i + 1`` are two spans of document ``i``, masked for MLM (coCondenser eq. 6-7)."""
    spans = [span for ids in docs for span in sample_spans(rng, ids, span_min, span_max)]
    return mlm_batch(spans, tokenizer, rng, mlm_probability, whole_word)


def read_passages_documents(
    path: str | Path, tokenizer, span_min: int
) -> tuple[list[list[int]], dict[str, int]]:
    from dprflow.schemas import read_table

    docs, n = document_tokens(read_table(path, "passages"), tokenizer)
    kept = [d for d in docs if len(d) >= span_min]
    counts = {"documents": n, "documents_too_short_skipped": n - len(kept), "documents_kept": len(kept)}
    for key, value in counts.items():
        log.info("span documents, %s: %d", key, value)
    if len(kept) < 2:
        raise StageError(f"{path}: fewer than 2 documents have {span_min} tokens or more: {counts}")
    return kept, counts
