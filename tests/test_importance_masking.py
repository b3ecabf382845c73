"""CDMAE importance-aware masking and uniform random masking (dprflow.pretraining.mae.importance_masking)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dprflow.pretraining.mae import importance_masking as im

VOCAB, CLS, SEP, PAD, MASK = 30522, 101, 102, 0, 103


def batch(rows: int, length: int, seed: int = 0, min_len: int = 3):
    """[CLS] tokens [SEP] then padding; ids of real tokens are >= 1000 (never a special id)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, length + 1, (rows,), generator=g)
    pos = torch.arange(length)[None, :]
    ids = torch.randint(1000, VOCAB, (rows, length), generator=g)
    ids[pos >= lens[:, None]] = PAD
    ids[:, 0] = CLS
    ids[torch.arange(rows), lens - 1] = SEP
    special = (ids == CLS) | (ids == SEP) | (ids == PAD)
    return ids, special


def phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@pytest.mark.parametrize("p", [0.0, 0.15, 0.29, 0.5, 1.0])
@pytest.mark.parametrize("kind", ["importance", "random"])
def test_exact_ratio_per_row_and_specials_never_masked(p, kind):
    ids, special = batch(64, 120, seed=3)
    ids[0], ids[0, 0], ids[0, 1:101], ids[0, 101] = PAD, CLS, 5000, SEP  # exactly 100 eligible tokens
    special[0] = (ids[0] == CLS) | (ids[0] == SEP) | (ids[0] == PAD)
    g = torch.Generator().manual_seed(0)
    importance = torch.randn(ids.shape, generator=g) * 3
    importance[special] = 1e9  # importance at special positions is ignored
    importance[1, 1], importance[2, 1], importance[3, 1] = float("nan"), float("inf"), float("-inf")
    if kind == "importance":
        masked, labels = im.importance_mask(ids, importance, special, p, MASK, VOCAB, g)
    else:
        masked, labels = im.random_mask(ids, special, p, MASK, VOCAB, g)
    n = (~special).sum(1)
    expected = torch.tensor([math.floor(int(m) * p + 1e-9) for m in n])
    assert torch.equal((labels != -100).sum(1), expected)
    assert torch.equal(im.n_masked(special, p), expected)
    if p == 0.29:
        assert expected[0] == 29  # floor(100 * 0.29) despite 100 * 0.29 = 28.999...
    assert not (labels[special] != -100).any()
    assert torch.equal(masked[special], ids[special])
    hit = labels != -100
    assert torch.equal(labels[hit], ids[hit])
    assert torch.equal(masked[~hit], ids[~hit])
    assert masked.dtype == ids.dtype and masked.shape == ids.shape


def test_replacement_is_80_10_10():
    ids, special = batch(256, 128, seed=4, min_len=100)
    g = torch.Generator().manual_seed(1)
    masked, labels = im.importance_mask(ids, torch.randn(ids.shape), special, 0.5, MASK, VOCAB, g)
    hit = labels != -100
    total = int(hit.sum())
    assert total > 12000
    to_mask = float((masked[hit] == MASK).sum()) / total
    kept = float((masked[hit] == ids[hit]).sum()) / total
    randomised = 1 - to_mask - kept
    assert abs(to_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(randomised - 0.1) < 0.015
    assert int(masked[hit][(masked[hit] != MASK) & (masked[hit] != ids[hit])].max()) < VOCAB


def test_importance_biases_masking_against_random():
    """High-importance tokens are masked far more often than under random masking (same seed)."""
    ids, special = batch(400, 40, seed=5, min_len=30)
    g = torch.Generator().manual_seed(2)
    high = torch.rand(ids.shape, generator=g) < 0.5
    importance = torch.where(high, 2.0, 0.0)
    p = 0.25
    draws = {"importance": [], "random": []}
    for _ in range(5):
        draws["importance"].append(im.importance_mask(ids, importance, special, p, MASK, VOCAB, g)[1] != -100)
        draws["random"].append(im.random_mask(ids, special, p, MASK, VOCAB, g)[1] != -100)
    eligible_high = (high & ~special).sum() * 5
    rate = {k: float(sum((m & high).sum() for m in v)) / float(eligible_high) for k, v in draws.items()}
    share = {
        k: float(sum((m & high).sum() for m in v)) / float(sum(m.sum() for m in v)) for k, v in draws.items()
    }
    # Random masking: a masked token is high-importance as often as an eligible token is (~0.5).
    base = float((high & ~special).sum()) / float((~special).sum())
    assert abs(share["random"] - base) < 0.03
    assert abs(rate["random"] - p) < 0.02
    # Importance-aware: mostly high-importance tokens; two-proportion z-test with a wide margin.
    # (at most half the eligible tokens are high and a quarter is masked: the rate can at most double)
    assert share["importance"] > 0.85 and rate["importance"] > 1.7 * rate["random"]
    n_i = sum(float(m.sum()) for m in draws["importance"])
    n_r = sum(float(m.sum()) for m in draws["random"])
    pooled = (share["importance"] * n_i + share["random"] * n_r) / (n_i + n_r)
    z = (share["importance"] - share["random"]) / math.sqrt(pooled * (1 - pooled) * (1 / n_i + 1 / n_r))
    assert z > 20


@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_gaussian_perturbation_has_standard_deviation_sigma(sigma):
    """Two eligible tokens, k = 1: P(first masked) = Phi((t1 - t2) / (sigma * sqrt 2))."""
    rows = 20000
    ids = torch.tensor([[CLS, 2000, 3000, SEP]]).repeat(rows, 1)
    special = (ids == CLS) | (ids == SEP)
    importance = torch.tensor([[0.0, 1.0, 0.0, 0.0]]).repeat(rows, 1)
    g = torch.Generator().manual_seed(3)
    _, labels = im.importance_mask(ids, importance, special, 0.5, MASK, VOCAB, g, sigma=sigma)
    first = float((labels[:, 1] != -100).float().mean())
    assert torch.equal((labels != -100).sum(1), torch.ones(rows, dtype=torch.long))
    assert abs(first - phi(1 / (sigma * math.sqrt(2)))) < 0.015


def test_random_mask_is_uniform_over_eligible_positions():
    ids = torch.tensor([[CLS] + list(range(2000, 2008)) + [SEP, PAD]]).repeat(4000, 1)
    special = (ids == CLS) | (ids == SEP) | (ids == PAD)
    g = torch.Generator().manual_seed(4)
    _, labels = im.random_mask(ids, special, 0.25, MASK, VOCAB, g)
    freq = (labels != -100).float().mean(0)
    assert torch.all((freq[1:9] - 0.25).abs() < 0.03)
    assert freq[0] == freq[9] == freq[10] == 0


def test_seeded_and_same_selection_as_the_torch_path(monkeypatch):
    ids, special = batch(32, 50, seed=6)
    importance = torch.randn(ids.shape)
    a = im.importance_mask(ids, importance, special, 0.5, MASK, VOCAB, torch.Generator().manual_seed(7))
    b = im.importance_mask(ids, importance, special, 0.5, MASK, VOCAB, torch.Generator().manual_seed(7))
    c = im.importance_mask(ids, importance, special, 0.5, MASK, VOCAB, torch.Generator().manual_seed(8))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) and not torch.equal(a[1], c[1])
    # Many ties, NaN and infinities: the numpy selection equals a stable descending argsort's.
    scores = torch.randint(0, 3, ids.shape).float()
    scores[0, 1], scores[1, 1], scores[2, 1] = float("nan"), float("inf"), float("-inf")
    k = im.n_masked(special, 0.5)
    ours = im._select_numpy(scores.numpy().copy(), special.numpy(), k.numpy())
    assert np.array_equal(ours, im._select_torch(scores, special, k).numpy())
    # The path other devices take (run here on CPU) obeys the same contract.
    monkeypatch.setattr(im, "_NUMPY_ON_CPU", False)
    masked, labels = im.importance_mask(ids, importance, special, 0.5, MASK, VOCAB, torch.Generator())
    assert torch.equal((labels != -100).sum(1), k) and not (labels[special] != -100).any()
    assert torch.equal(masked[labels == -100], ids[labels == -100])


def test_bad_arguments_are_rejected():
    ids, special = batch(2, 10)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        im.random_mask(ids, special, 1.5, MASK, VOCAB)
    with pytest.raises(ValueError, match="importance has shape"):
        im.importance_mask(ids, torch.zeros(2, 9), special, 0.5, MASK, VOCAB)
    with pytest.raises(ValueError, match="bool tensor"):
        im.random_mask(ids, special.long(), 0.5, MASK, VOCAB)
    with pytest.raises(ValueError, match="mask_prob"):
        im.random_mask(ids, special, 0.5, MASK, VOCAB, mask_prob=0.95, random_prob=0.1)
