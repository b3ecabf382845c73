"""BERT masking: exact counts, special tokens and padding untouched, 80/10/10, whole words, determinism."""

import numpy as np
import pytest
import torch

from dprflow.pretraining.masking import (
    IGNORE_INDEX,
    generator_from,
    mask_tokens,
    special_tokens_mask,
    word_ids_tensor,
)

PAD, CLS, SEP, MASK, VOCAB = 0, 1, 2, 3, 1000
SPECIAL_IDS = (PAD, CLS, SEP, MASK)


def batch(lengths: list[int], width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] w ... w [SEP] [PAD]...: ``lengths`` counts the real words (no special tokens)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n + 1] = CLS, SEP
        ids[b, 1 : n + 1] = torch.randint(10, VOCAB, (n,), generator=g)
        mask[b, : n + 2] = 1
    return ids, mask


def run(ids, mask, seed=0, **kwargs):
    special = special_tokens_mask(ids, mask, SPECIAL_IDS)
    return mask_tokens(ids, special, MASK, VOCAB, torch.Generator().manual_seed(seed), **kwargs)


def test_special_tokens_mask_marks_specials_and_padding():
    ids, mask = batch([3, 1], width=6)
    special = special_tokens_mask(ids, mask, SPECIAL_IDS)
    assert special.tolist() == [
        [True, False, False, False, True, True],
        [True, False, True, True, True, True],
    ]


@pytest.mark.parametrize("p", [0.15, 0.3])
def test_exact_count_per_sequence_and_never_specials_or_padding(p):
    lengths = [1, 3, 6, 7, 10, 20, 33, 40]  # at p=0.15: 1, 1 (at least one), 1, 1, 2 (1.5 to even), 3, 5, 6
    ids, mask = batch(lengths, width=42)
    special = special_tokens_mask(ids, mask, SPECIAL_IDS)
    for seed in range(5):
        masked, labels = run(ids, mask, seed=seed, p=p)
        selected = labels != IGNORE_INDEX
        expected = [max(1, round(p * n)) for n in lengths]  # Python's round: halves to even
        assert selected.sum(dim=1).tolist() == expected
        assert not (selected & special).any()
        assert torch.equal(masked[special], ids[special])  # specials and padding untouched
        assert torch.equal(masked[~selected], ids[~selected])  # only selected positions change
        assert torch.equal(labels[selected], ids[selected])  # labels: the original ids


def test_a_sequence_without_maskable_tokens_gets_no_mask():
    ids, mask = batch([0, 4], width=6)
    _, labels = run(ids, mask)
    assert (labels != IGNORE_INDEX).sum(dim=1).tolist() == [0, 1]


def test_80_10_10_proportions():
    ids, mask = batch([100] * 20, width=102)
    ids[:, 1:101] = 500  # every real token is 500, so "random" = changed to another id
    counts = {"mask": 0, "random": 0, "kept": 0}
    for seed in range(20):
        masked, labels = run(ids, mask, seed=seed)
        chosen = masked[labels != IGNORE_INDEX]
        counts["mask"] += int((chosen == MASK).sum())
        counts["kept"] += int((chosen == 500).sum())
        counts["random"] += int(((chosen != MASK) & (chosen != 500)).sum())
    total = sum(counts.values())
    assert total == 20 * 20 * 15
    # 6000 draws: 3 standard deviations of a proportion are about 0.016 (0.8) and 0.012 (0.1)
    assert abs(counts["mask"] / total - 0.8) < 0.02
    assert abs(counts["random"] / total - 0.1) < 0.015
    assert abs(counts["kept"] / total - 0.1) < 0.015


def test_deterministic_given_the_seed():
    ids, mask = batch([12, 30, 7], width=32)
    a = run(ids, mask, seed=7)
    b = run(ids, mask, seed=7)
    c = run(ids, mask, seed=8)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.labels, c.labels)
    g1, g2 = generator_from(np.random.default_rng([13, 4])), generator_from(np.random.default_rng([13, 4]))
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


def test_positions_are_uniform():
    ids, mask = batch([10], width=12)
    hits = torch.zeros(12)
    for seed in range(400):
        hits += (run(ids, mask, seed=seed).labels[0] != IGNORE_INDEX).float()  # 2 of 10 each time
    assert hits[0] == 0 and hits[11] == 0
    assert hits[1:11].min() > 50 and hits[1:11].max() < 110  # expected 80 per position


def test_whole_word_masks_whole_words_with_an_exact_word_count():
    # words of 1-3 sub-word tokens; word ids per position, -1 at [CLS]/[SEP]/padding
    spans = [[1, 3, 2, 1, 2, 3, 1, 1, 2, 3, 1, 2, 1, 1], [2, 2, 1, 3]]
    width = 2 + max(sum(s) for s in spans)
    ids, mask = batch([sum(s) for s in spans], width=width)
    word_lists = [[None] + [w for w, n in enumerate(s) for _ in range(n)] + [None] for s in spans]
    word_ids = word_ids_tensor(word_lists, length=width)
    assert word_ids[1].tolist()[:10] == [-1, 0, 0, 1, 1, 2, 3, 3, 3, -1]
    for seed in range(30):
        masked, labels = run(ids, mask, seed=seed, whole_word=True, word_ids=word_ids)
        selected = labels != IGNORE_INDEX
        for b, s in enumerate(spans):
            words = word_ids[b][selected[b]].unique().tolist()
            assert len(words) == max(1, round(0.15 * len(s)))  # exact count in words
            for w in words:  # every token of a chosen word is chosen
                assert selected[b][word_ids[b] == w].all()
            assert selected[b].sum() == sum(s[w] for w in words)
        assert not (selected & special_tokens_mask(ids, mask, SPECIAL_IDS)).any()


def test_whole_word_needs_word_ids_and_errors_are_clear():
    ids, mask = batch([5], width=7)
    with pytest.raises(ValueError, match="word_ids"):
        run(ids, mask, whole_word=True)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        run(ids, mask, p=0.0)
    special = special_tokens_mask(ids, mask, SPECIAL_IDS)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        mask_tokens(ids, special, VOCAB, VOCAB, torch.Generator())


def test_whole_word_count_tokens_is_berts_greedy_fill():
    """BERT's create_masked_lm_predictions with do_whole_word_mask: a target of round(p * n)
    tokens, whole words in a random order, a word that would overshoot skipped; never more."""
    from dprflow.pretraining.masking import select_positions

    # one row: [CLS] then words of 3, 1, 2, 1, 4, 1, 2, 1, 3, 2 pieces (20 tokens) then [SEP]
    sizes = [3, 1, 2, 1, 4, 1, 2, 1, 3, 2]
    word_ids = [-1] + [w for w, n in enumerate(sizes) for _ in range(n)] + [-1]
    word_ids = torch.tensor([word_ids])
    special = word_ids < 0
    counts, by_words = [], []
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        chosen = select_positions(special, g, p=0.3, word_ids=word_ids, whole_word_count="tokens")[0]
        counts.append(int(chosen.sum()))
        for w in range(len(sizes)):  # whole words only
            in_w = word_ids[0] == w
            assert bool(chosen[in_w].all()) or not bool(chosen[in_w].any())
        assert not chosen[special[0]].any()
        g = torch.Generator().manual_seed(seed)
        by_words.append(int(select_positions(special, g, p=0.3, word_ids=word_ids)[0].sum()))
    # target round(0.3 * 20) = 6 tokens: single-piece words always let the fill reach it exactly
    assert set(counts) == {6}
    # the "words" count selects round(0.3 * 10) = 3 words, 3 to 9 tokens
    assert min(by_words) < 6 < max(by_words)
    # a target no word combination reaches: words of 4 and 4 pieces, target round(0.5 * 8) = 4
    ids = torch.tensor([[-1, 0, 0, 0, 0, 1, 1, 1, 1, -1]])
    got = select_positions(
        ids < 0, torch.Generator().manual_seed(0), p=0.5, word_ids=ids, whole_word_count="tokens"
    )
    assert int(got.sum()) == 4
    ids = torch.tensor([[-1, 0, 0, 0, 1, 1, 1, -1]])  # 6 tokens, target 3: one word of 3
    got = select_positions(
        ids < 0, torch.Generator().manual_seed(0), p=0.5, word_ids=ids, whole_word_count="tokens"
    )
    assert int(got.sum()) == 3
    ids = torch.tensor([[-1, 0, 0, 1, 1, 1, -1]])  # 5 tokens, target round(2.5) = 2: one word of 2
    got = select_positions(
        ids < 0, torch.Generator().manual_seed(1), p=0.5, word_ids=ids, whole_word_count="tokens"
    )
    assert got[0].tolist() == [False, True, True, False, False, False, False]
    with pytest.raises(ValueError, match="whole_word_count must be one of"):
        select_positions(ids < 0, torch.Generator(), p=0.5, word_ids=ids, whole_word_count="pieces")
