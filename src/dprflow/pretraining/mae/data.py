"""Inputs of masked auto-encoder pre-training: BMAE, CDMAE and CoT-MAE batches.

The model (:class:`dprflow.pretraining.mae.model.BottleneckedMAE`) takes an encoder input and a decoder
input per row; this module makes them. Texts are tokenized once, without special tokens; every
token carries its AMI importance (CDMAE eq. 7-8, :func:`dprflow.pretraining.mae.pmi.token_importance`, sub-word
pieces inheriting their word's value) when n-gram statistics are given.

* ``bmae`` (CDMAE's ablation baseline): a row is a chunk of ``max_length - 2`` tokens of a text;
  the encoder input is the chunk masked at random with ratio ``p_enc`` (0.3), the decoder input
  the same chunk masked again at random with ``p_dec`` (0.5).
* ``cdmae`` (CDMAE §3.2, Algorithm 1): as ``bmae``, but the decoder side is masked by token
  importance perturbed with N(0, sigma^2) noise (:func:`dprflow.pretraining.mae.importance_masking.importance_mask`);
  the encoder keeps random masking.
* ``cotmae`` (CoT-MAE; query-as-context §2.2): a row is a pair of spans of one document, each of
  ``span_min`` to ``span_max`` tokens; the anchor goes to the encoder (``p_enc`` 0.3), the
  context to the decoder (``p_dec`` about 0.45). ``context="near"`` puts the context right
  before or after the anchor (a side with room for at least ``span_min`` tokens, chosen at
  random; when neither side has room it is drawn at random in the document, and counted);
  ``"random"`` draws it anywhere in the document, as CoT-MAE's random sampling does.

Both masks select exactly ``floor(n * p)`` of the ``n`` non-special tokens of a row, then apply
BERT's 80/10/10 replacement. Every draw comes from the batch's own generator (resume-safe).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from dprflow.pretraining.mae import pmi
from dprflow.pretraining.mae.importance_masking import importance_mask, random_mask
from dprflow.pretraining.masking import generator_from, special_tokens_mask

log = logging.getLogger(__name__)

VARIANTS = ("bmae", "cdmae", "cotmae")
CONTEXTS = ("near", "random")


class TokenText(NamedTuple):
    """One text's token ids (no special tokens) and their importance (``None`` without statistics)."""

    ids: np.ndarray  # [n] int64
    importance: np.ndarray | None  # [n] float32


def tokenize_with_importance(
    texts: Sequence[str], tokenizer, stats: pmi.NgramCounts | None = None, batch_size: int = 1024
) -> list[TokenText]:
    """Tokenize whole texts once (no special tokens, no truncation), with each token's AMI."""
    out: list[TokenText] = []
    for start in range(0, len(texts), batch_size):
        batch = list(texts[start : start + batch_size])
        enc = tokenizer(
            batch,
            add_special_tokens=False,
            truncation=False,
            return_offsets_mapping=stats is not None,
            return_special_tokens_mask=stats is not None,
        )
        rows = (
            pmi.token_importance(batch, tokenizer, stats, encoding=enc)
            if stats is not None
            else [None] * len(batch)
        )
        for ids, imp in zip(enc["input_ids"], rows, strict=True):
            out.append(TokenText(np.asarray(ids, dtype=np.int64), imp))
    return out


def chunk_texts(texts: Sequence[TokenText], length: int, min_length: int = 8) -> tuple[list[TokenText], int]:
    """Consecutive chunks of at most ``length`` tokens; returns them and the number of trailing
    chunks shorter than ``min_length`` that were dropped (too short to mask meaningfully)."""
    chunks, dropped = [], 0
    for t in texts:
        for start in range(0, len(t.ids), length):
            ids = t.ids[start : start + length]
            if len(ids) < min_length:
                dropped += 1
                continue
            imp = None if t.importance is None else t.importance[start : start + length]
            chunks.append(TokenText(ids, imp))
    return chunks, dropped


def sample_anchor_context(
    rng: np.random.Generator, n_tokens: int, span_min: int, span_max: int, context: str
) -> tuple[tuple[int, int], tuple[int, int], bool]:
    """``(anchor, context, fell_back)``: two ``[start, stop)`` spans of a document of ``n_tokens``.

    Lengths are uniform in ``[span_min, min(span_max, n_tokens)]``. ``fell_back`` is True when a
    ``near`` context had no room on either side and was drawn at random instead.
    """
    if n_tokens < span_min:
        raise ValueError(f"a document of {n_tokens} tokens is shorter than span_min={span_min}")
    hi = min(span_max, n_tokens)
    a_len = int(rng.integers(span_min, hi + 1))
    a_start = int(rng.integers(0, n_tokens - a_len + 1))
    anchor = (a_start, a_start + a_len)
    c_len = int(rng.integers(span_min, hi + 1))
    if context == "near":
        sides = []
        if a_start >= span_min:
            sides.append("before")
        if n_tokens - anchor[1] >= span_min:
            sides.append("after")
        if sides:
            side = sides[int(rng.integers(len(sides)))]
            if side == "before":
                length = min(c_len, a_start)
                return anchor, (a_start - length, a_start), False
            length = min(c_len, n_tokens - anchor[1])
            return anchor, (anchor[1], anchor[1] + length), False
    elif context != "random":
        raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
    c_start = int(rng.integers(0, n_tokens - c_len + 1))
    return anchor, (c_start, c_start + c_len), context == "near"


def pad_rows(rows: Sequence[np.ndarray], tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[CLS] row [SEP]``, padded: ``(input_ids, attention_mask, special)``, each ``[B, L]``."""
    length = max(len(r) for r in rows) + 2
    input_ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, 0] = tokenizer.cls_token_id
        input_ids[i, 1 : len(r) + 1] = torch.from_numpy(np.asarray(r, dtype=np.int64))
        input_ids[i, len(r) + 1] = tokenizer.sep_token_id
        attention_mask[i, : len(r) + 2] = 1
    special = special_tokens_mask(input_ids, attention_mask, tokenizer.all_special_ids)
    return input_ids, attention_mask, special


def mae_batch(
    variant: str,
    items: Sequence[TokenText],
    tokenizer,
    rng: np.random.Generator,
    *,
    p_enc: float,
    p_dec: float,
    sigma: float = 1.0,
    span_min: int = 16,
    span_max: int = 64,
    context: str = "near",
) -> dict[str, torch.Tensor]:
    """The encoder and decoder inputs and labels of one batch (see the module docstring): the
    keyword arguments of :meth:`BottleneckedMAE.forward`, plus ``fallbacks`` (how many ``near``
    contexts were drawn at random), which the caller pops before the call.

    ``items`` are chunks (``bmae``, ``cdmae``; ``cdmae`` needs their importance) or documents
    (``cotmae``).
    """
    if variant == "cotmae":
        enc_rows, dec_rows, fallbacks = [], [], 0
        for it in items:
            (a0, a1), (c0, c1), fell = sample_anchor_context(rng, len(it.ids), span_min, span_max, context)
            enc_rows.append(it.ids[a0:a1])
            dec_rows.append(it.ids[c0:c1])
            fallbacks += fell
        batch = pair_mae_batch(enc_rows, dec_rows, tokenizer, rng, p_enc=p_enc, p_dec=p_dec)
        batch["fallbacks"] = torch.tensor(float(fallbacks))
        return batch
    if variant not in ("bmae", "cdmae"):
        raise ValueError(f"unknown MAE variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    # One chunk on both sides, masked twice: at random for the encoder; at random (bmae) or by
    # importance (cdmae) for the decoder.
    g = generator_from(rng)
    vocab, mask_id = len(tokenizer), tokenizer.mask_token_id
    ids, attention, special = pad_rows([it.ids for it in items], tokenizer)
    enc_input, enc_labels = random_mask(ids, special, p_enc, mask_id, vocab, g)
    if variant == "cdmae":
        if any(it.importance is None for it in items):
            raise ValueError("cdmae masking needs token importance (n-gram statistics)")
        importance = pmi.pad_importance(
            [np.concatenate([[-np.inf], it.importance, [-np.inf]]) for it in items], ids.shape[1]
        )
        dec_input, dec_labels = importance_mask(
            ids, torch.from_numpy(importance), special, p_dec, mask_id, vocab, g, sigma
        )
    else:
        dec_input, dec_labels = random_mask(ids, special, p_dec, mask_id, vocab, g)
    return _forward_inputs(enc_input, attention, enc_labels, dec_input, attention, dec_labels)


def pair_mae_batch(
    enc_rows: Sequence[np.ndarray],
    dec_rows: Sequence[np.ndarray],
    tokenizer,
    rng: np.random.Generator,
    *,
    p_enc: float,
    p_dec: float,
) -> dict[str, torch.Tensor]:
    """Encoder and decoder inputs from given rows, both masked at random (CoT-MAE with explicit
    contexts; query-as-context: the passage to the encoder, its generated query to the decoder)."""
    g = generator_from(rng)
    vocab, mask_id = len(tokenizer), tokenizer.mask_token_id
    enc_ids, enc_attention, enc_special = pad_rows(enc_rows, tokenizer)
    enc_input, enc_labels = random_mask(enc_ids, enc_special, p_enc, mask_id, vocab, g)
    dec_ids, dec_attention, dec_special = pad_rows(dec_rows, tokenizer)
    dec_input, dec_labels = random_mask(dec_ids, dec_special, p_dec, mask_id, vocab, g)
    return _forward_inputs(enc_input, enc_attention, enc_labels, dec_input, dec_attention, dec_labels)


def _forward_inputs(enc_input, enc_attention, enc_labels, dec_input, dec_attention, dec_labels):
    """The keyword arguments of :meth:`BottleneckedMAE.forward`, ``fallbacks`` 0 (set by the caller)."""
    return dict(
        enc_input_ids=enc_input,
        enc_attention_mask=enc_attention,
        enc_labels=enc_labels,
        dec_input_ids=dec_input,
        dec_attention_mask=dec_attention,
        dec_labels=dec_labels,
        fallbacks=torch.tensor(0.0),
    )
