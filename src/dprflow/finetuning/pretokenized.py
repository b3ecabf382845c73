"""Fine-tuning batches from token ids made once before training (``training.pretokenize``).

The retriever and reranker stages draw each batch's passages from the queries' pools at random,
so their batches were tokenized from text inside the training loop, a few hundred texts a step
(a retriever step of 64 queries x 8 passages: 576 texts), on the host while the GPU waited.
Here the training queries and the passages are tokenized once before the first step:

- the passages streamed a chunk at a time into a token store in the stage's scratch folder
  (:mod:`dprflow.data.token_store`: memory-mapped, a batch reads its rows, the corpus is never
  held as Python objects), cut to the longest a batch can use;
- the training queries into two arrays, ids and offsets (:class:`TokenRows`, 4 bytes a token).

A batch is then assembled from ids as the tokenizer would: ``[CLS] ids [SEP]`` (a pair:
``[CLS] q [SEP] p [SEP]``, cut longest first, with token types 0 then 1), padded on the right to
its longest. :func:`same_as_tokenizer` compares the assembly with the tokenizer's own output on the
first training items before training; a tokenizer whose output it does not reproduce (another
template, left padding) is used per batch as before, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from dprflow.data.token_store import TokenStore, TokenStoreWriter

log = logging.getLogger(__name__)

CHUNK = 4096  # texts tokenized at once


class TokenRows(Sequence):
    """Token ids of many short texts in two arrays: row ``i`` is ``ids[offsets[i]:offsets[i + 1]]``."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids, self.offsets = ids, offsets

    @classmethod
    def tokenize(cls, texts: Iterable[str], tokenizer, max_tokens: int) -> TokenRows:
        """``texts`` tokenized without special tokens, each cut to ``max_tokens``."""
        ids, lengths = [], []
        for chunk in _chunks(texts):
            for row in _ids(tokenizer, chunk, max_tokens):
                ids.append(np.asarray(row, dtype=np.int32))
                lengths.append(len(row))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.concatenate(ids) if ids else np.zeros(0, np.int32), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]


def tokenize_to_store(texts: Sequence[str], tokenizer, max_tokens: int, folder: str | Path) -> TokenStore:
    """``texts`` (a sequence read row by row, such as the stage's passage texts) tokenized
    without special tokens, each cut to ``max_tokens``, into a token store at ``folder``; row
    ``i`` of the store is text ``i``."""
    with TokenStoreWriter(
        folder, tokenizer, view="fine-tuning texts", meta={"max_tokens": max_tokens}
    ) as out:
        for start in range(0, len(texts), CHUNK):
            out.extend(
                _ids(tokenizer, [texts[i] for i in range(start, min(start + CHUNK, len(texts)))], max_tokens)
            )
    return out.store


def _chunks(texts: Iterable[str]) -> Iterable[list[str]]:
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _ids(tokenizer, texts: list[str], max_tokens: int) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False, truncation=True, max_length=max_tokens)["input_ids"]


def longest_first(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
    """Tokens kept of a pair of ``n_a`` and ``n_b`` tokens cut to ``budget`` together, as the
    tokenizers' ``longest_first`` truncation keeps them: the shorter side whole when it takes at
    most half the budget (the longer one the rest), else half each, the odd token to the longer
    side (to the second on a tie)."""
    if n_a + n_b <= budget:
        return n_a, n_b
    shorter = min(n_a, n_b)
    kept_short = shorter if 2 * shorter <= budget else budget // 2
    kept_long = budget - kept_short
    return (kept_long, kept_short) if n_a > n_b else (kept_short, kept_long)


def single_batch(rows: Sequence[np.ndarray], tokenizer, max_length: int):
    """``[CLS] row [SEP]`` of each row cut to ``max_length`` tokens in all, padded to the
    longest: what ``tokenizer(texts, max_length=max_length, truncation=True, padding=True,
    return_tensors="pt")`` gives."""
    return _assemble([(row[: max_length - 2], None) for row in rows], tokenizer)


def pair_batch(first: Sequence[np.ndarray], second: Sequence[np.ndarray], tokenizer, max_length: int):
    """``[CLS] a [SEP] b [SEP]`` of each pair cut longest first to ``max_length`` tokens, padded
    to the longest: what :func:`dprflow.finetuning.reranking.tokenize_pairs` gives."""
    pairs = []
    for a, b in zip(first, second, strict=True):
        n_a, n_b = longest_first(len(a), len(b), max_length - 3)
        pairs.append((a[:n_a], b[:n_b]))
    return _assemble(pairs, tokenizer)


def _assemble(pairs: list[tuple[np.ndarray, np.ndarray | None]], tokenizer):
    """A ``BatchEncoding`` (transformers, imported here: the stage modules import no transformers
    until they load a tokenizer) of the pairs, padded on the right."""
    from transformers import BatchEncoding

    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    lengths = [len(a) + 2 + (0 if b is None else len(b) + 1) for a, b in pairs]
    shape = (len(pairs), max(lengths))
    input_ids = torch.full(shape, tokenizer.pad_token_id, dtype=torch.long)
    types = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.long)
    for i, ((a, b), n) in enumerate(zip(pairs, lengths, strict=True)):
        row = [cls_id, *a.tolist(), sep_id] + ([] if b is None else [*b.tolist(), sep_id])
        input_ids[i, :n] = torch.tensor(row, dtype=torch.long)
        mask[i, :n] = 1
        if b is not None:
            types[i, len(a) + 2 : n] = 1
    out = {"input_ids": input_ids, "token_type_ids": types, "attention_mask": mask}
    return BatchEncoding({k: v for k, v in out.items() if k in tokenizer.model_input_names})


class Indexed(Sequence):
    """``items`` with their index: item ``i`` is ``(i, items[i])`` (a batch finds its queries' ids)."""

    def __init__(self, items: Sequence) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[int, object]:
        return i, self.items[i]


class GroupTokens:
    """The token ids of a group-trained stage (retriever, reranker): its training queries
    (:class:`TokenRows`, cut to ``query_tokens``) and every passage (a token store in ``folder``,
    cut to ``passage_tokens``; row ``r`` is passage row ``r`` of the stage's texts)."""

    def __init__(
        self, items: Sequence, texts: Sequence[str], tokenizer, query_tokens: int, passage_tokens: int, folder
    ) -> None:
        self.queries = TokenRows.tokenize((items[i].text for i in range(len(items))), tokenizer, query_tokens)
        self.passages = tokenize_to_store(texts, tokenizer, passage_tokens, folder)
        log.info(
            "tokenized %d training queries and %d passages once (%d passage tokens)",
            len(self.queries),
            len(self.passages),
            self.passages.n_tokens,
        )


def from_ids_if_same(
    name: str,
    items: Sequence,
    from_ids: Callable[[np.random.Generator, list], object],
    from_texts: Callable[[np.random.Generator, list], object],
    n: int = 8,
) -> tuple[Sequence, Callable]:
    """The training items and ``make_batch`` of a stage: ``from_ids`` over :class:`Indexed`
    items when its first batch (``n`` items, the same random draws) equals ``from_texts``'s
    tensor for tensor, else ``from_texts`` over the items, with a warning."""
    head = list(range(min(n, len(items))))
    assembled = from_ids(np.random.default_rng(0), [(i, items[i]) for i in head])
    tokenized = from_texts(np.random.default_rng(0), [items[i] for i in head])
    if same_batch(assembled, tokenized):
        log.info(
            "%s: batches from token ids made once before training (the tokenizer's, token for token)", name
        )
        return Indexed(items), from_ids
    log.warning(
        "%s: this tokenizer's batches are not [CLS] text [SEP] padded on the right; its texts are tokenized "
        "per batch (training.pretokenize has no effect with it)",
        name,
    )
    return items, from_texts


def same_batch(a: object, b: object) -> bool:
    """Whether two batches (tensors in mappings and tuples) hold the same tensors under the same names."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(same_batch(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_batch(x, y) for x, y in zip(a, b, strict=True))
    return a is None and b is None
