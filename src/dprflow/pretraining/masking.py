"""Masked-language-model input corruption (BERT's scheme), shared by the MLM pre-training stages.

Condenser §3.3 "follow[s] the masking scheme in Devlin et al. (2019)": a fraction ``p`` (15%) of
the tokens is selected for prediction; of the selected tokens 80% are replaced by ``[MASK]``,
10% by a random token and 10% are left unchanged; the loss is computed on the selected positions
only (labels ``-100`` elsewhere, the ignore index of ``torch.nn.functional.cross_entropy``)::

    input_ids:   [CLS]  the  cat  sat  on  the  mat  [SEP] [PAD]
    masked_ids:  [CLS]  the [MASK] sat on  the  mat  [SEP] [PAD]
    labels:      -100  -100  cat  -100 -100 -100 -100  -100  -100

Selection is an exact count per sequence, not a coin flip per token (as in BERT's
``create_pretraining_data.py``, unlike Hugging Face's ``DataCollatorForLanguageModeling``): of the
``n`` maskable units of a sequence (tokens, or words with ``whole_word=True``; special tokens and
padding are never maskable) exactly ``k = max(1, round(p * n))`` are selected (``k = 0`` when
``n = 0``), ``round`` rounding halves to even like Python's. BERT counts ``n`` over all tokens of
the sequence including ``[CLS]`` and ``[SEP]``; here they are excluded, a difference of at most
one selected token at ``p = 0.15``.

With whole words there are two ways to count (``whole_word_count``): ``"words"`` selects
``round(p * n_words)`` words (every piece of each), so more than ``p`` of the tokens when words
have several pieces; ``"tokens"`` is BERT's reference (``create_masked_lm_predictions`` with
``do_whole_word_mask``): a target of ``max(1, round(p * n_tokens))`` tokens, filled greedily with
whole words in a random order, a word that would overshoot the target skipped (a shorter later
one may fit), so exactly the target or slightly fewer tokens, never more.

Everything is drawn from the ``torch.Generator`` given, so a batch's masking is a pure function
of the generator's seed (resume-safe, see :mod:`dprflow.training.trainer`). The functions are
vectorised over the batch: no Python loop over tokens or sequences.

Papers (in ``shared/papers``): Condenser §3.3 (eq. 9); coCondenser §3.1 (eq. 5).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import torch

IGNORE_INDEX = -100  # label of positions without a prediction (cross_entropy's ignore_index)
MASK_FRACTION = 0.8  # of the selected tokens: replaced by [MASK] (Devlin et al., 2019, §3.1)
RANDOM_FRACTION = 0.1  # replaced by a random token; the remaining 0.1 keep their original token


class MaskedTokens(NamedTuple):
    """The corrupted inputs and the MLM targets."""

    input_ids: torch.Tensor  # [B, L] with the selected tokens replaced (80% [MASK], 10% random, 10% kept)
    labels: torch.Tensor  # [B, L] original id at the selected positions, -100 elsewhere


def generator_from(rng: np.random.Generator, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded from a numpy generator (the Trainer's per-batch ``rng``).

    Draws one 63-bit seed from ``rng``, so the masking stays a pure function of the batch's seed.
    """
    return torch.Generator(device=device).manual_seed(int(rng.integers(2**63 - 1)))


def special_tokens_mask(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    special_ids: Iterable[int] = (),
) -> torch.Tensor:
    """``[B, L]`` bool, True where a token must never be masked: padding and special tokens.

    Args:
        input_ids: ``[B, L]`` token ids.
        attention_mask: ``[B, L]``, 0 at padding; ``None`` when there is no padding.
        special_ids: ids never to mask, e.g. ``tokenizer.all_special_ids`` ([CLS], [SEP], [PAD], ...).
    """
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    ids = sorted(set(int(i) for i in special_ids))
    if ids:
        special |= torch.isin(input_ids, torch.tensor(ids, dtype=input_ids.dtype, device=input_ids.device))
    if attention_mask is not None:
        special |= attention_mask == 0
    return special


def word_ids_tensor(word_ids: Sequence[Sequence[int | None]], length: int | None = None) -> torch.Tensor:
    """``[B, L]`` long tensor of word indices from a fast tokenizer's ``encoding.word_ids(i)`` lists.

    ``None`` (special tokens) and padding beyond a list's end become ``-1``. For a pair of
    sequences the tokenizer restarts word indices at 0 in the second one; offset them first so
    that two different words never share an index.
    """
    length = max((len(w) for w in word_ids), default=0) if length is None else length
    out = torch.full((len(word_ids), length), -1, dtype=torch.long)
    for b, ids in enumerate(word_ids):
        row = [-1 if w is None else int(w) for w in ids[:length]]
        out[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def _rank_select(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``[B, U]`` bool: per row, the ``k[b]`` units with the smallest scores."""
    order = scores.argsort(dim=1)  # [B, U]
    positions = torch.arange(scores.size(1), device=scores.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(1, order, positions)  # rank of each unit in its row
    return ranks < k[:, None]


def _num_to_select(n: torch.Tensor, p: float) -> torch.Tensor:
    """``k = max(1, round(p * n))`` units per row (0 for an empty row), as BERT's num_to_predict."""
    k = torch.round(n.double() * p).long().clamp(min=1)
    return torch.where(n > 0, k, torch.zeros_like(k))


WHOLE_WORD_COUNTS = ("words", "tokens")


def _greedy_whole_words(
    scores: torch.Tensor, tokens_per_word: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """``[B, W]`` bool: per row, words taken in ascending ``scores`` while they fit in ``target``
    tokens, a word that would overshoot skipped (BERT's ``create_masked_lm_predictions``)."""
    order = scores.argsort(dim=1).cpu().numpy()
    sizes = tokens_per_word.cpu().numpy()
    chosen = np.zeros(sizes.shape, dtype=bool)
    for b, k in enumerate(target.cpu().tolist()):
        total = 0
        for w in order[b]:
            if total >= k:
                break
            size = int(sizes[b, w])
            if size == 0 or total + size > k:
                continue
            chosen[b, w] = True
            total += size
    return torch.from_numpy(chosen).to(scores.device)


def select_positions(
    special_mask: torch.Tensor,
    rng: torch.Generator,
    p: float = 0.15,
    word_ids: torch.Tensor | None = None,
    whole_word_count: str = "words",
) -> torch.Tensor:
    """``[B, L]`` bool: the positions selected for prediction, uniformly at random.

    Token level (``word_ids=None``): exactly ``max(1, round(p * n))`` of the ``n`` tokens not in
    ``special_mask``. Word level: exactly ``max(1, round(p * n_words))`` of the ``n_words`` words
    that have at least one maskable token, every maskable token of a selected word included; with
    ``whole_word_count="tokens"``, BERT's count: whole words up to ``max(1, round(p * n))`` tokens
    (module docstring).

    This is the random selection policy; importance-aware policies (CDMAE) can replace it and
    reuse :func:`apply_mask` for the 80/10/10 corruption.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"masking probability p must be in (0, 1), got {p}")
    if whole_word_count not in WHOLE_WORD_COUNTS:
        raise ValueError(f"whole_word_count must be one of {WHOLE_WORD_COUNTS}, got {whole_word_count!r}")
    maskable = ~special_mask.bool()  # [B, L]
    B, L = maskable.shape
    device = maskable.device
    if word_ids is None:
        scores = torch.rand(B, L, generator=rng, device=rng.device).to(device)
        scores = scores.masked_fill(~maskable, 2.0)  # never among the k smallest (k <= n maskable)
        return _rank_select(scores, _num_to_select(maskable.sum(dim=1), p)) & maskable

    if word_ids.shape != maskable.shape:
        raise ValueError(
            f"word_ids {tuple(word_ids.shape)} and input_ids {tuple(maskable.shape)} differ in shape"
        )
    word_ids = word_ids.to(device)
    in_word = maskable & (word_ids >= 0)  # tokens that belong to a maskable word
    index = word_ids.clamp(min=0)  # [B, L]
    n_units = max(int(word_ids.max().item()) + 1 if word_ids.numel() else 0, 1)  # W
    tokens_per_word = torch.zeros(B, n_units, dtype=torch.long, device=device)
    word_present = tokens_per_word.scatter_add_(1, index, in_word.long()) > 0  # [B, W]
    scores = torch.rand(B, n_units, generator=rng, device=rng.device).to(device)
    scores = scores.masked_fill(~word_present, 2.0)
    if whole_word_count == "tokens":
        target = _num_to_select(in_word.sum(dim=1), p)
        chosen_words = _greedy_whole_words(scores, tokens_per_word, target) & word_present
        return chosen_words.gather(1, index) & in_word
    chosen_words = _rank_select(scores, _num_to_select(word_present.sum(dim=1), p)) & word_present
    return chosen_words.gather(1, index) & in_word  # [B, L]


def apply_mask(
    input_ids: torch.Tensor,
    selected: torch.Tensor,
    mask_token_id: int,
    vocab_size: int,
    rng: torch.Generator,
) -> MaskedTokens:
    """Corrupt the selected positions, 80% ``[MASK]`` / 10% random token / 10% unchanged.

    The choice is made independently for every selected token (also within a whole word, as in
    BERT and Hugging Face). Random tokens are drawn uniformly from ``[0, vocab_size)``, special
    tokens included, as in Hugging Face's collator.

    Returns:
        :class:`MaskedTokens` ``(input_ids [B, L], labels [B, L])``.
    """
    selected = selected.bool()
    draw = torch.rand(input_ids.shape, generator=rng, device=rng.device).to(input_ids.device)
    random_ids = torch.randint(vocab_size, input_ids.shape, generator=rng, device=rng.device)
    random_ids = random_ids.to(device=input_ids.device, dtype=input_ids.dtype)
    to_mask = selected & (draw < MASK_FRACTION)
    to_random = selected & (draw >= MASK_FRACTION) & (draw < MASK_FRACTION + RANDOM_FRACTION)
    masked = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(to_random, random_ids, masked)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return MaskedTokens(masked, labels)


def mask_tokens(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    mask_token_id: int,
    vocab_size: int,
    rng: torch.Generator,
    p: float = 0.15,
    whole_word: bool = False,
    word_ids: torch.Tensor | None = None,
    whole_word_count: str = "words",
) -> MaskedTokens:
    """BERT masked-LM corruption of a batch (Devlin et al., 2019; Condenser §3.3).

    Selects exactly ``max(1, round(p * n))`` of each sequence's ``n`` maskable tokens (or words,
    with ``whole_word=True``), see :func:`select_positions`, then replaces 80% of the selected
    tokens by ``[MASK]``, 10% by a random token and keeps 10%, see :func:`apply_mask`.

    Assumes: ``special_mask`` marks every special token and every padding position
    (:func:`special_tokens_mask` builds it from ``attention_mask`` and
    ``tokenizer.all_special_ids``); those are never selected.

    Args:
        input_ids: ``[B, L]`` token ids (not modified).
        special_mask: ``[B, L]`` bool, True where a token must never be masked.
        mask_token_id: the id of ``[MASK]``.
        vocab_size: random replacement tokens are drawn from ``[0, vocab_size)``.
        rng: every random draw comes from it; the same seed gives the same masking.
        p: fraction of the maskable units to select (0.15 in BERT and the Condenser papers).
        whole_word: select whole words: every sub-word token of a selected word is masked.
        word_ids: ``[B, L]`` word index of each token, -1 for special tokens and padding
            (:func:`word_ids_tensor` of the fast tokenizer's ``word_ids()``); needed with
            ``whole_word``.
        whole_word_count: ``"words"`` (``p`` of the words) or ``"tokens"`` (BERT's reference:
            whole words up to ``p`` of the tokens); see the module docstring.

    Returns:
        :class:`MaskedTokens` ``(input_ids, labels)``, both ``[B, L]``; ``labels`` holds the
        original id at the selected positions and -100 elsewhere.

    Example::

        enc = tokenizer(texts, padding=True, return_tensors="pt")
        special = special_tokens_mask(enc["input_ids"], enc["attention_mask"], tokenizer.all_special_ids)
        rng = torch.Generator().manual_seed(13)
        masked = mask_tokens(enc["input_ids"], special, tokenizer.mask_token_id, len(tokenizer), rng)
        loss = model(masked.input_ids, enc["attention_mask"], labels=masked.labels).loss
    """
    if input_ids.dim() != 2 or special_mask.shape != input_ids.shape:
        raise ValueError(
            f"expected input_ids and special_mask of the same shape [B, L], got {tuple(input_ids.shape)} "
            f"and {tuple(special_mask.shape)}"
        )
    if whole_word and word_ids is None:
        raise ValueError(
            "whole_word=True needs word_ids (the fast tokenizer's word_ids(), see word_ids_tensor)"
        )
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the vocabulary [0, {vocab_size})")
    selected = select_positions(special_mask, rng, p, word_ids if whole_word else None, whole_word_count)
    return apply_mask(input_ids, selected, mask_token_id, vocab_size, rng)


def wordpiece_word_ids(tokens: Sequence[str]) -> list[int]:
    """Word index of each WordPiece token: a new word starts at every token not prefixed by '##',
    and at a leading '##' piece (a chunk cut inside a word): that piece is a word of its own, as
    in the reference collators (luyug/Condenser ``data.py`` ``_whole_word_cand_indexes_bert``,
    Hugging Face's ``DataCollatorForWholeWordMask``), so it can be masked."""
    word, out = -1, []
    for tok in tokens:
        if word < 0 or not tok.startswith("##"):
            word += 1
        out.append(word)
    return out
