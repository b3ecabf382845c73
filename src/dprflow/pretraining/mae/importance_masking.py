"""Importance-aware masking (CDMAE, Algorithm 1) and uniform random masking (BMAE), batched.

CDMAE masks the *decoder* input by token importance (the AMI of :mod:`dprflow.pretraining.mae.pmi`); the encoder
keeps random masking. Algorithm 1 for one sequence ``x`` with importance ``t`` and ratio ``p``::

    t_i <- t_i + N(0, sigma^2)          (sigma = 1, footnote 3)
    k    = floor(len(x) * p)
    mask the k tokens of highest perturbed importance

Both functions here apply that to a padded batch at once:

* ``len(x)`` is the number of *eligible* tokens of a row: those not flagged in ``special_mask``
  (which must flag special tokens *and* padding). Exactly ``k = floor(n * p)`` of them are
  masked in every row (computed in float64 with a 1e-9 tolerance, so 100 x 0.29 gives 29); special
  and padding positions never are.
* Masked positions are then replaced as in BERT (80/10/10): ``[MASK]`` with probability 0.8, a
  token drawn uniformly from ``[0, vocab_size)`` with probability 0.1 (as Hugging Face's MLM
  collator does, special ids included), else kept. ``labels`` holds the original id at masked
  positions and -100 (the loss's ignore index) elsewhere.
* :func:`random_mask` is the same with uniform scores: a uniformly random subset of exactly
  ``k`` eligible tokens per row (the BMAE baseline, and CDMAE's encoder side).

Selecting a top-k with a *different* k per row is done without a loop over rows or tokens. On
CPU, one row-wise numpy sort of the scores gives each row's k-th largest score, the row's
threshold; scores at or above it are masked, and in the rare case of ties at a threshold the
tied tokens with the lowest columns are kept (a cumulative count along the row), so exactly k
are masked. numpy's row-wise sort of float32 values is several times faster than ``torch.sort``
or any argsort on CPU. Other devices use ``torch.argsort(stable=True)`` and a scatter, which
selects the same tokens for the same scores; the random draws differ between the two paths
(the CPU path draws the 80/10/10 decisions only for the masked positions, as 21-bit uniform
integers cut three from each 63-bit draw, so the 0.8 and 0.1 hold to 2^-21).

On eligible tokens, NaN or -inf importance counts as the lowest finite score (such tokens are
masked last, but still before any special token) and +inf as the highest. CDMAE uses the AMI as
is (natural-log PMI sums, spread over several units), so with ``sigma=1`` masking follows
importance closely.

Example::

    g = torch.Generator().manual_seed(0)
    ids, labels = importance_mask(batch["input_ids"], importance, special, p=0.5,
                                  mask_token_id=tok.mask_token_id, vocab_size=len(tok), generator=g)
"""

from __future__ import annotations

import numpy as np
import torch

IGNORE_INDEX = -100
_F32_MAX = float(np.finfo(np.float32).max)
_NUMPY_ON_CPU = True  # CPU tensors take the numpy path (tests switch it off to run the torch path)
_CODE_BITS = 21
_CODE_MASK = (1 << _CODE_BITS) - 1


def n_masked(special_mask: torch.Tensor, p: float) -> torch.Tensor:
    """``floor(n * p)`` per row, where ``n`` counts the positions not flagged in ``special_mask``."""
    _check_p(p)
    n = (~special_mask).sum(dim=1).to(torch.float64)
    return torch.floor(n * p + 1e-9).to(torch.int64)


def importance_mask(
    input_ids: torch.Tensor,
    importance: torch.Tensor,
    special_mask: torch.Tensor,
    p: float,
    mask_token_id: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    sigma: float = 1.0,
    *,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CDMAE Algorithm 1 over a batch: mask the ``floor(n p)`` most important tokens after noise.

    Args:
        input_ids: ``[B, L]`` integer token ids (padded).
        importance: ``[B, L]`` float importance (e.g. :func:`dprflow.pretraining.mae.pmi.token_importance`); its
            values at special/padding positions are ignored.
        special_mask: ``[B, L]`` bool, True at special tokens and padding (never masked).
        p: masking ratio in [0, 1] (CDMAE's decoder: 0.5).
        mask_token_id, vocab_size: the ``[MASK]`` id and the range of random replacements.
        generator: torch random generator (None: torch's default).
        sigma: standard deviation of the Gaussian perturbation (paper: 1).
        mask_prob, random_prob: shares of masked positions replaced by ``[MASK]`` and by a random
            token (the rest keep their token); BERT's 0.8 and 0.1.

    Returns:
        ``(masked_ids, labels)``, both ``[B, L]`` like ``input_ids``; ``labels`` is the original id
        at masked positions and -100 elsewhere.
    """
    _check_inputs(input_ids, special_mask, mask_prob, random_prob)
    importance = torch.as_tensor(importance)
    if importance.shape != input_ids.shape:
        raise ValueError(
            f"importance has shape {tuple(importance.shape)}, input_ids {tuple(input_ids.shape)}"
        )
    scores = torch.randn(input_ids.shape, generator=generator, dtype=torch.float32, device=input_ids.device)
    if sigma != 1.0:
        scores.mul_(sigma)
    scores.add_(importance.to(device=scores.device, dtype=torch.float32))  # fresh: _mask may overwrite it
    return _mask(
        input_ids, scores, special_mask, p, mask_token_id, vocab_size, generator, mask_prob, random_prob
    )


def random_mask(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    p: float,
    mask_token_id: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    *,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random masking of exactly ``floor(n p)`` eligible tokens per row (BMAE baseline).

    Same arguments and result as :func:`importance_mask`, without importance.
    """
    _check_inputs(input_ids, special_mask, mask_prob, random_prob)
    scores = torch.rand(input_ids.shape, generator=generator, dtype=torch.float32, device=input_ids.device)
    return _mask(
        input_ids, scores, special_mask, p, mask_token_id, vocab_size, generator, mask_prob, random_prob
    )


def _check_p(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"masking ratio p must be in [0, 1], got {p}")


def _check_inputs(input_ids, special_mask, mask_prob, random_prob) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if special_mask.shape != input_ids.shape or special_mask.dtype != torch.bool:
        raise ValueError(
            f"special_mask must be a bool tensor shaped like input_ids {tuple(input_ids.shape)}, "
            f"got {special_mask.dtype} {tuple(special_mask.shape)}"
        )
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if mask_prob < 0 or random_prob < 0 or mask_prob + random_prob > 1:
        raise ValueError(
            f"need mask_prob, random_prob >= 0 and their sum <= 1; got {mask_prob}, {random_prob}"
        )


def _mask(input_ids, scores, special_mask, p, mask_token_id, vocab_size, generator, mask_prob, random_prob):
    _check_p(p)
    if _NUMPY_ON_CPU and input_ids.device.type == "cpu":
        return _mask_cpu(
            input_ids, scores, special_mask, p, mask_token_id, vocab_size, generator, mask_prob, random_prob
        )
    selected = _select_torch(scores, special_mask, n_masked(special_mask, p).to(scores.device))
    u = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    use_mask = selected & (u < mask_prob)
    use_random = selected & (u >= mask_prob) & (u < mask_prob + random_prob)
    rand_ids = torch.randint(vocab_size, input_ids.shape, generator=generator, device=input_ids.device)
    masked = torch.where(use_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(use_random, rand_ids.to(input_ids.dtype), masked)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return masked, labels


def _select_numpy(scores: np.ndarray, special: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Bool [B, L]: the ``k[r]`` highest scores of each row ``r`` of ``scores`` (float32, overwritten).

    Ties are broken by column (lower first), as a stable descending argsort would; special
    positions are never selected (``k[r]`` must not exceed the row's eligible count).
    """
    s = scores
    np.fmax(s, -_F32_MAX, out=s)  # NaN and -inf -> lowest finite: below any score, above specials
    np.copyto(s, -np.inf, where=special)
    length = s.shape[1]
    # The k-th largest score of each row is its threshold: one row-wise sort (no argsort needed).
    ranked = np.sort(s, axis=1)
    thr = ranked[np.arange(len(k)), np.minimum(length - k, length - 1)]
    thr[k == 0] = np.inf
    chosen = s >= thr[:, None]
    if np.count_nonzero(chosen) != k.sum():  # ties at a threshold (or +inf scores in k=0 rows)
        take = k[:, None] > 0
        above = (s > thr[:, None]) & take
        tied = (s == thr[:, None]) & take
        need = k[:, None] - np.count_nonzero(above, axis=1)[:, None]
        chosen = above | (tied & (np.cumsum(tied, axis=1) <= need))
    return chosen


def _select_torch(scores: torch.Tensor, special: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Bool [B, L]: the ``k[r]`` highest scores of each row, as :func:`_select_numpy` (same ties)."""
    s = torch.nan_to_num(scores.float(), nan=-_F32_MAX, posinf=_F32_MAX, neginf=-_F32_MAX)
    s = s.masked_fill(special, float("-inf"))
    order = torch.argsort(s, dim=1, descending=True, stable=True)
    take = torch.arange(s.shape[1], device=s.device).expand_as(s) < k[:, None]
    return torch.zeros_like(special).scatter_(1, order, take)


def _uniform_codes(n: int, generator) -> np.ndarray:
    """``n`` independent uniform integers in [0, 2^21), three from each random 63-bit draw."""
    draws = torch.empty((n + 2) // 3, dtype=torch.int64).random_(generator=generator).numpy()
    codes = np.empty((len(draws), 3), dtype=np.int64)
    codes[:, 0] = draws & _CODE_MASK
    codes[:, 1] = (draws >> _CODE_BITS) & _CODE_MASK
    codes[:, 2] = draws >> (2 * _CODE_BITS)
    return codes.reshape(-1)[:n]


def _mask_cpu(
    input_ids, scores, special_mask, p, mask_token_id, vocab_size, generator, mask_prob, random_prob
):
    special = special_mask.numpy()
    k = ((special.shape[1] - special.sum(axis=1)) * p + 1e-9).astype(np.int64)  # floor (n p >= 0)
    idx = np.flatnonzero(_select_numpy(scores.numpy(), special, k))
    input_ids = input_ids.contiguous()
    masked = input_ids.clone()
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    ids_flat, masked_flat = input_ids.numpy().reshape(-1), masked.numpy().reshape(-1)
    labels.numpy().reshape(-1)[idx] = ids_flat[idx]
    # 80/10/10 decisions from 21-bit uniform codes (probabilities exact to 2^-21).
    code = _uniform_codes(len(idx), generator)
    cut_mask = round(mask_prob * (1 << _CODE_BITS))
    cut_random = round((mask_prob + random_prob) * (1 << _CODE_BITS))
    masked_flat[idx[code < cut_mask]] = mask_token_id
    to_random = idx[(code >= cut_mask) & (code < cut_random)]
    if len(to_random):
        masked_flat[to_random] = torch.randint(vocab_size, (len(to_random),), generator=generator).numpy()
    return masked, labels
