"""Cutting documents into passages of at most N tokens by grouping whole sentences.

Rule (stage ``split_passages``): a document's title and text are kept apart; the *text* is split
into sentences, and consecutive sentences are grouped greedily while the passage's token count
(the model's tokenizer, special tokens excluded) stays within ``max_tokens``. A sentence longer
than that on its own is cut at word boundaries into pieces that fit (a single word longer than
the limit is kept whole and truncated later by the encoder). Every passage keeps the document's
title. Passage ids are ``<doc_id>#<position>`` with position counted from 0, so they are stable
for a fixed document text and limit. Documents whose title and text are both empty yield no
passage and are counted; a document with a title but no text yields one passage with empty text.

Speed (MS MARCO documents: 3.2M documents of about 1,100 words): :func:`split_documents` counts
the tokens of a whole batch of documents' sentences in one call of the Rust tokenizer (which
spreads a batch over its threads, ``RAYON_NUM_THREADS``), and, for tokenizers whose counts add up
over text joined with a space (:func:`counts_add_up`: WordPiece behind BERT's normalizer and
pre-tokenizer, the tokenizer of every model the presets start from), counts each distinct word
once and takes a sentence's count as the sum of its words' and a passage's as the sum of its
sentences', instead of tokenizing every sentence and then every passage. :func:`split_documents_reference`
is the plain path, one tokenizer call per document and a final count of every passage; the tests
check that both give the same table.
"""

from __future__ import annotations

import json
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
    return group_sentences_counted(sentences, count(sentences), max_tokens, count)


def group_sentences_counted(
    sentences: list[str], sizes: list[int], max_tokens: int, count: Callable[[list[str]], list[int]]
) -> list[tuple[str, int]]:
    """:func:`group_sentences` with the sentences' token counts given (``count`` counts the words
    of a sentence too long on its own)."""
    out: list[tuple[str, int]] = []
    cur: list[str] = []
    cur_n = 0
    for sentence, n in zip(sentences, sizes, strict=True):
        for piece, size in _pieces(sentence, n, max_tokens, count):
            # Joining two pieces with a space adds no token for WordPiece/BPE tokenizers, so token
            # counts add up (counts_add_up); split_documents recounts the joined text otherwise.
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


def split_documents_reference(
    documents: pd.DataFrame, tokenizer, max_tokens: int
) -> tuple[pd.DataFrame, dict[str, int]]:
    """The passages table and the counts, one document at a time: the reference that
    :func:`split_documents` must equal (see the module docstring for the rule)."""
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


# Parts of a fast tokenizer (its tokenizer.json) that work on each character, or each
# whitespace-separated word, on its own: through them, the tokens of ``a + " " + b`` are the tokens
# of ``a`` followed by those of ``b``.
_LOCAL_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFD", "StripAccents"}
_WHITESPACE_PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}


def counts_add_up(spec: dict) -> bool:
    """Whether a tokenizer.json (``spec``) counts ``" ".join(texts)`` as the sum of the texts'
    counts (special tokens excluded): a WordPiece model over a whitespace-splitting pre-tokenizer
    and per-character normalizers, and no added token holding whitespace (added tokens are
    matched on the raw text). Byte-level BPE and SentencePiece tokenizers, which mark the space
    before a word inside the word's token, do not; their passages are counted again."""

    def parts(node: dict | None, key: str) -> list[str]:
        if node is None:
            return []
        if node.get("type") == "Sequence":
            return [t for child in node[key] for t in parts(child, key)]
        return [node.get("type")]

    normalizers = parts(spec.get("normalizer"), "normalizers")
    pre_tokenizers = parts(spec.get("pre_tokenizer"), "pretokenizers")
    return (
        spec.get("model", {}).get("type") == "WordPiece"
        and all(n in _LOCAL_NORMALIZERS for n in normalizers)
        and bool(pre_tokenizers)
        and all(p in _WHITESPACE_PRE_TOKENIZERS for p in pre_tokenizers)
        and not any(re.search(r"\s", t.get("content", "")) for t in spec.get("added_tokens", []))
    )


class BatchCounter:
    """Token counts of many texts in one call (special tokens excluded, no truncation), equal to
    :func:`token_counter`'s. A fast tokenizer is called through its Rust backend (a copy set up
    as ``tokenizer(texts, add_special_tokens=False, truncation=False)`` sets it: no truncation, no
    padding), which skips building Python lists of ids; any other tokenizer through ``__call__``.

    When counts add up over a space (:func:`counts_add_up`), a text's count is the sum of the
    counts of its words (``text.split(" ")``, so the text is their join), and each distinct word
    is tokenized once: the words of a corpus repeat (Zipf), so a batch of documents tokenizes a
    few thousand distinct words instead of every token. The word counts are kept across calls,
    up to ``cache_words`` of them (then dropped and begun again); texts are split into words
    ``chunk_texts`` at a time (a batch of 4,096 documents of 1,100 words holds 4.5M words).
    """

    def __init__(self, tokenizer, cache_words: int = 1 << 20, chunk_texts: int = 8192):
        backend = (
            getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        )
        self.additive = False
        self.cache_words, self.chunk_texts = cache_words, chunk_texts
        self._words: dict[str, int] = {}
        self._fallback = token_counter(tokenizer)
        self._backend = None
        if backend is not None:
            from tokenizers import Tokenizer

            spec = backend.to_str()
            self._backend = Tokenizer.from_str(spec)
            self._backend.no_truncation()
            self._backend.no_padding()
            self._backend.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
            self.additive = counts_add_up(json.loads(spec))

    def _encode(self, texts: list[str]) -> list[int]:
        encode = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        return [len(encoding) for encoding in encode(texts, add_special_tokens=False)]

    def __call__(self, texts: list[str]) -> list[int]:
        if self._backend is None:
            return self._fallback(texts)
        if not texts:
            return []
        if not self.additive:
            return self._encode(texts)
        out: list[int] = []
        for start in range(0, len(texts), self.chunk_texts):  # the words of one chunk in memory
            if len(self._words) > self.cache_words:
                self._words.clear()
            words = self._words
            split = [text.split(" ") for text in texts[start : start + self.chunk_texts]]
            new = list({w for ws in split for w in ws if w not in words})
            if new:
                words.update(zip(new, self._encode(new), strict=True))
            out.extend([sum([words[w] for w in ws]) for ws in split])
        return out


def split_documents(
    documents: pd.DataFrame, tokenizer: BatchCounter | object, max_tokens: int
) -> tuple[pd.DataFrame, dict[str, int]]:
    """The passages table and the counts (the rule of the module docstring), the batch's tokens
    counted in one :class:`BatchCounter` call per kind of text: the sentences of every document,
    the words of the sentences too long on their own, and (unless counts add up, when a passage's
    count is the sum of its pieces') the passages. Equal to
    :func:`split_documents_reference`. ``tokenizer`` is a tokenizer or a :class:`BatchCounter`
    (a stage builds it once)."""
    count = tokenizer if isinstance(tokenizer, BatchCounter) else BatchCounter(tokenizer)
    counts = {"documents": len(documents), "documents_empty_skipped": 0}
    kept: list[tuple[str, str, list[str]]] = []  # doc_id, title, sentences
    for doc_id, title, text in documents[["doc_id", "title", "text"]].itertuples(index=False):
        if not title.strip() and not text.strip():
            counts["documents_empty_skipped"] += 1
            continue
        kept.append((doc_id, title, split_sentences(text)))
    sizes = iter(count([s for _, _, sentences in kept for s in sentences]))
    sentence_sizes = [[next(sizes) for _ in sentences] for _, _, sentences in kept]
    # The words of every sentence longer than max_tokens on its own, counted in one call.
    long_words = [
        s.split()
        for (_, _, sentences), ns in zip(kept, sentence_sizes, strict=True)
        for s, n in zip(sentences, ns, strict=True)
        if n > max_tokens
    ]
    word_sizes = iter(count([w for words in long_words for w in words]))
    long_sizes = iter([[next(word_sizes) for _ in words] for words in long_words])

    def count_words(words: list[str]) -> list[int]:  # _pieces asks for them in the same order
        return next(long_sizes)

    rows = []
    for (doc_id, title, sentences), ns in zip(kept, sentence_sizes, strict=True):
        groups = group_sentences_counted(sentences, ns, max_tokens, count_words) if sentences else [("", 0)]
        for position, (passage, n) in enumerate(groups):
            rows.append((f"{doc_id}#{position}", doc_id, position, title, passage, n))
    passages = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"])
    if not count.additive and len(passages):
        # Exact token counts of the final texts (joining may merge tokens for this tokenizer).
        passages["n_tokens"] = count(passages["text"].tolist())
    over = int((passages["n_tokens"] > max_tokens).sum()) if len(passages) else 0
    counts["passages"] = len(passages)
    counts["passages_over_limit_single_word"] = over
    return passages, counts
