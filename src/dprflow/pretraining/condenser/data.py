"""The batches Condenser and coCondenser feed their losses.

Condenser (stage ``pretrain_generic``, Condenser §3.3): ``[CLS] chunk [SEP]`` rows of the generic
corpus with BERT masking (:func:`mlm_batch`).

coCondenser (stage ``pretrain_corpus``, coCondenser §3.2): each batch draws two spans per
document; rows ``2i`` and ``2i + 1`` are the two spans of document ``i``, masked for the MLM part of
eq. 7 (:func:`pair_batch`). Two samplers (``spans``):

- ``non_overlapping`` (:func:`sample_non_overlapping_spans`): the authors' "random non overlapping
  sequences" of 128 tokens for passage retrieval (luyug/Condenser issue #5; their
  ``CoCondenserDataset`` draws two distinct spans of a document's span list);
- ``independent`` (:func:`sample_spans`): two spans of a random length in ``[span_min,
  span_max]`` at independent random positions (they may overlap).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dprflow.pretraining.masking import (
    generator_from,
    mask_tokens,
    special_tokens_mask,
    word_ids_tensor,
    wordpiece_word_ids,
)


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


def sample_non_overlapping_spans(
    rng: np.random.Generator, ids: Sequence[int], span_max: int
) -> list[list[int]]:
    """Two disjoint spans of one document (coCondenser §3.2: "random non-overlapping sequences").

    The document, from a random offset, is cut into its ``n = len(ids) // span_max`` consecutive
    spans of ``span_max`` tokens; two distinct ones are drawn uniformly (the reference samples two
    of a document's spans without replacement). A document shorter than ``2 * span_max`` is cut
    into two halves of ``len(ids) // 2`` tokens.
    """
    if len(ids) < 2:
        raise ValueError(f"a document of {len(ids)} token(s) has no two non-overlapping spans")
    if len(ids) < 2 * span_max:
        half = len(ids) // 2
        return [list(ids[:half]), list(ids[half : 2 * half])]
    n = len(ids) // span_max
    offset = int(rng.integers(0, len(ids) - n * span_max + 1))
    first, second = (int(k) for k in rng.choice(n, size=2, replace=False))
    return [list(ids[offset + k * span_max : offset + (k + 1) * span_max]) for k in (first, second)]


SPAN_SAMPLERS = ("independent", "non_overlapping")


def mlm_batch(
    pieces: Sequence[Sequence[int]],
    tokenizer,
    rng: np.random.Generator,
    mlm_probability: float = 0.15,
    whole_word: bool = False,
    whole_word_count: str = "words",
) -> dict[str, torch.Tensor]:
    """``[CLS] piece [SEP]`` rows, padded, with BERT masking: input_ids, attention_mask, labels
    (``whole_word_count``: see :mod:`dprflow.pretraining.masking`)."""
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
        whole_word_count=whole_word_count,
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
    whole_word_count: str = "words",
    spans: str = "independent",
) -> dict[str, torch.Tensor]:
    """Rows ``2i`` and ``2i + 1`` are two spans of document ``i``, masked for MLM (coCondenser eq. 6-7);
    ``spans``: one of :data:`SPAN_SAMPLERS` (module docstring)."""
    if spans == "non_overlapping":
        pairs = [sample_non_overlapping_spans(rng, ids, span_max) for ids in docs]
    elif spans == "independent":
        pairs = [sample_spans(rng, ids, span_min, span_max) for ids in docs]
    else:
        raise ValueError(f"spans: {spans!r} is not one of {SPAN_SAMPLERS}")
    rows = [span for pair in pairs for span in pair]
    return mlm_batch(rows, tokenizer, rng, mlm_probability, whole_word, whole_word_count)
