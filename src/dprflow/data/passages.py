"""Cutting documents into passages of at most N tokens by grouping whole sentences.

Rule (stage ``split_passages``): a document's title and text are kept apart; the *text* is split
into sentences, and consecutive sentences are grouped greedily while the passage's token count
(the model's tokenizer, special tokens excluded) stays within ``max_tokens``. A sentence longer
than that on its own is cut at word boundaries into pieces that fit (a single word longer than
the limit is kept whole and truncated later by the encoder). Every passage keeps the document's
title. Passage ids are ``<doc_id>#<position>`` with position counted from 0, so they are stable
for a fixed document text and limit. Documents whose title and text are both empty yield no
passage and are counted; a document with a title but no text yields one passage with empty text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import pandas as pd

# A sentence ends at ., ! or ? followed by space and an upper-case letter, digit, quote or bracket,
# or at a blank line (paragraph break). Deliberately simple: no abbreviation list.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])|\n\s*\n")


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def _pieces(
    sentence: str, n: int, max_tokens: int, count: Callable[[list[str]], list[int]]
) -> Iterable[tuple[str, int]]:
    """Yield (text, n_tokens) pieces of a sentence that fit in max_tokens, cut at word boundaries."""
    if n <= max_tokens:
        yield sentence, n
        return
    words = sentence.split()
    sizes = count(words)
    cur: list[str] = []
    cur_n = 0
    for word, size in zip(words, sizes, strict=True):
        if cur and cur_n + size > max_tokens:
            yield " ".join(cur), cur_n
            cur, cur_n = [], 0
        cur.append(word)
        cur_n += size
    if cur:
        yield " ".join(cur), cur_n


def group_sentences(
    sentences: list[str], max_tokens: int, count: Callable[[list[str]], list[int]]
) -> list[tuple[str, int]]:
    """Greedily pack sentences into passages of at most max_tokens tokens; returns (text, n_tokens)."""
    out: list[tuple[str, int]] = []
    cur: list[str] = []
    cur_n = 0
    for sentence, n in zip(sentences, count(sentences), strict=True):
        for piece, size in _pieces(sentence, n, max_tokens, count):
            # Joining two pieces with a space adds no token for WordPiece/BPE tokenizers, so token
            # counts add up; the final count is recomputed on the joined text below anyway.
            if cur and cur_n + size > max_tokens:
                out.append((" ".join(cur), cur_n))
                cur, cur_n = [], 0
            cur.append(piece)
            cur_n += size
    if cur:
        out.append((" ".join(cur), cur_n))
    return out


def token_counter(tokenizer) -> Callable[[list[str]], list[int]]:
    def count(texts: list[str]) -> list[int]:
        if not texts:
            return []
        enc = tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]
        return [len(ids) for ids in enc]

    return count


def split_documents(
    documents: pd.DataFrame, tokenizer, max_tokens: int
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Return the passages table and counts of what was done (see the module docstring for the rule)."""
    count = token_counter(tokenizer)
    rows = []
    counts = {"documents": len(documents), "documents_empty_skipped": 0}
    for doc_id, title, text in documents[["doc_id", "title", "text"]].itertuples(index=False):
        if not title.strip() and not text.strip():
            counts["documents_empty_skipped"] += 1
            continue
        sentences = split_sentences(text)
        groups = group_sentences(sentences, max_tokens, count) if sentences else [("", 0)]
        for position, (passage, _) in enumerate(groups):
            rows.append((f"{doc_id}#{position}", doc_id, position, title, passage))
    passages = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text"])
    # Exact token counts of the final texts (joining may merge tokens for some tokenizers).
    passages["n_tokens"] = count(passages["text"].tolist()) if len(passages) else []
    over = int((passages["n_tokens"] > max_tokens).sum()) if len(passages) else 0
    counts["passages"] = len(passages)
    counts["passages_over_limit_single_word"] = over
    return passages, counts
