"""Positive pairs from single documents for Contriever's contrastive pre-training (Contriever §3.1.2).

A "document" of Contriever Appendix A ("documents of 256 tokens") is a window of the corpus's
token stream: the tokens of every document (no special tokens), concatenated in corpus order
with no separator, cut into consecutive windows of ``max_doc_tokens`` = 256 tokens
(:func:`stream_documents`; facebookresearch/contriever ``preprocess.py`` and ``src/data.py``), so
every token of a long document is used and a window may straddle two documents. The reference
drops the last partial window and shifts the windows by a random offset each epoch; here the
offset is 0 and the last partial window is kept as a shorter document (when it holds 2 tokens or
more), so every token is in exactly one window in every epoch. The previous behaviour, each
document cut to its first ``max_doc_tokens`` tokens, is :func:`first_tokens` (not the paper's).
Two ways to make the two views of a pair:

- ``"crop"``, independent cropping (§3.1.2): two spans drawn independently, each contiguous,
  its length a uniformly random fraction ``r ~ U[ratio_min, ratio_max]`` of the document length
  (``floor(r * n)``, at least 1 token; Appendix A: 10% to 50% for the model fine-tuned on
  MS MARCO, 5% to 50% for the unsupervised one), its start uniform over the positions where it
  fits. The views may overlap; the task is symmetric (both views follow one distribution).
- ``"ict"``, the inverse Cloze task (§3.1.2, Lee et al. 2019): a span ``[a, b)`` is the query and
  the document with that span removed is the key. The span length follows the cropping rule
  above (Contriever samples a token span, where Lee et al. use a sentence), cut so that at least
  one token is left for the key. Lee et al. keep the span in the key 10% of the time;
  ``ict_keep_prob`` (default 0: Contriever's definition, "the rest of the tokens") does that.

Additional perturbations (§3.1.2 "Additional data augmentation"; Table 4), applied to each view
after the crop, each token independently, by one uniform draw ``u``: deleted if
``u < p_delete``, else replaced by a random non-special token if ``u < p_delete + p_replace``,
else replaced by ``[MASK]`` if ``u < p_delete + p_replace + p_mask``. The paper deletes *words*;
this deletes WordPiece tokens. Appendix A's default is word deletion with probability 20%
(``p_delete = 0.2``); Table 4 reports that, after fine-tuning, deletion and replacement slightly
hurt, so 0 is a reasonable ablation. (The released script ``contriever.sh`` deletes 10%.)

Edge cases, both impossible in the reference at paper scale (a 256-token window and
``r >= 0.05`` give crops of at least 12 tokens): a crop of ``int(r * n) == 0`` tokens (a short
last window) is one token (``max(1, .)``); a view whose every token was drawn for deletion keeps
its first token, where the reference would give an empty ``[CLS] [SEP]`` view.

All randomness comes from the ``np.random.Generator`` passed in, so a batch is a pure function of
the Trainer's ``(seed, step)`` generator (resume-safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

PAIR_MODES = ("crop", "ict")


def check_pair_mode(mode: str) -> str:
    if mode not in PAIR_MODES:
        raise ValueError(f"unknown pair mode {mode!r}; allowed: {', '.join(PAIR_MODES)}")
    return mode


def stream_documents(
    docs: Sequence[Sequence[int]], length: int, min_length: int = 2
) -> tuple[list[list[int]], dict[str, int]]:
    """Windows of ``length`` tokens of the concatenated token stream of ``docs`` (Contriever
    Appendix A; module docstring), the last one shorter, and the counts: tokens, windows, and
    whether the last window was dropped for holding fewer than ``min_length`` tokens."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    stream = np.fromiter((t for d in docs for t in d), dtype=np.int64)
    windows = [stream[start : start + length].tolist() for start in range(0, len(stream), length)]
    dropped = 0
    if windows and len(windows[-1]) < min_length:
        windows.pop()
        dropped = 1
    counts = {
        "stream_tokens": int(len(stream)),
        "stream_documents": len(windows),
        "short_last_window_skipped": dropped,
    }
    return windows, counts


def first_tokens(docs: Sequence[Sequence[int]], length: int) -> list[list[int]]:
    """Each document cut to its first ``length`` tokens (not Appendix A: the rest is never used)."""
    return [list(d[:length]) for d in docs]


def span_length(rng: np.random.Generator, n: int, ratio_min: float, ratio_max: float) -> int:
    """``max(1, floor(r * n))`` with ``r ~ U[ratio_min, ratio_max]``, at most ``n``."""
    ratio = rng.uniform(ratio_min, ratio_max)
    return int(min(n, max(1, int(ratio * n))))


def random_crop(
    rng: np.random.Generator, ids: Sequence[int], ratio_min: float, ratio_max: float
) -> tuple[int, int]:
    """``(start, end)`` of one random crop of ``ids`` (Contriever §3.1.2 "independent cropping")."""
    length = span_length(rng, len(ids), ratio_min, ratio_max)
    start = int(rng.integers(0, len(ids) - length + 1))
    return start, start + length


def crop_pair(
    rng: np.random.Generator, ids: Sequence[int], ratio_min: float, ratio_max: float
) -> tuple[list[int], list[int]]:
    """Two independent random crops of one document: ``(query view, key view)``."""
    a0, a1 = random_crop(rng, ids, ratio_min, ratio_max)
    b0, b1 = random_crop(rng, ids, ratio_min, ratio_max)
    return list(ids[a0:a1]), list(ids[b0:b1])


def ict_pair(
    rng: np.random.Generator,
    ids: Sequence[int],
    ratio_min: float,
    ratio_max: float,
    keep_prob: float = 0.0,
) -> tuple[list[int], list[int]]:
    """Inverse Cloze task (Contriever §3.1.2): ``(span, document without the span)``.

    The span ``ids[a:b]`` has at most ``len(ids) - 1`` tokens so the key is never empty; with
    probability ``keep_prob`` the key is the whole document (Lee et al. 2019's 10%).
    Needs documents of at least 2 tokens.
    """
    n = len(ids)
    if n < 2:
        raise ValueError(f"ICT needs documents of at least 2 tokens, got {n}")
    length = min(span_length(rng, n, ratio_min, ratio_max), n - 1)
    start = int(rng.integers(0, n - length + 1))
    query = list(ids[start : start + length])
    keep = keep_prob > 0 and rng.random() < keep_prob
    key = list(ids) if keep else [*ids[:start], *ids[start + length :]]
    return query, key


@dataclass
class PairMaker:
    """Turns documents into padded ``[CLS] view [SEP]`` query and key inputs (Contriever §3.1.2).

    Built from a tokenizer with :meth:`from_tokenizer`. ``replace_ids`` are the token ids a
    replacement draws from (the vocabulary without the special tokens).

    Example::

        maker = PairMaker.from_tokenizer(tok, mode="crop", p_delete=0.2)
        batch = maker.batch(np.random.default_rng(0), documents[:8])
        batch["q_input_ids"].shape     # [8, Lq]; k_input_ids [8, Lk]
    """

    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    replace_ids: np.ndarray = field(repr=False)
    mode: str = "crop"  # "crop" (independent cropping) or "ict" (inverse Cloze task), §3.1.2
    ratio_min: float = 0.1  # shortest span, share of the document (Appendix A: 0.1; unsupervised 0.05)
    ratio_max: float = 0.5  # longest span, share of the document (Appendix A: 0.5)
    max_doc_tokens: int = 256  # documents are cut to their first tokens (Appendix A: 256)
    p_delete: float = 0.2  # token deletion per view (Appendix A: word deletion, 20%)
    p_replace: float = 0.0  # random-token replacement (Table 4 "Crop + replace")
    p_mask: float = 0.0  # [MASK] replacement (§3.1.2 "random word masking")
    ict_keep_prob: float = 0.0  # ICT: keep the span in the key (Lee et al. 2019: 0.1)

    def __post_init__(self) -> None:
        check_pair_mode(self.mode)
        if not 0.0 < self.ratio_min <= self.ratio_max <= 1.0:
            raise ValueError(f"need 0 < ratio_min <= ratio_max <= 1, got {self.ratio_min}, {self.ratio_max}")
        if self.max_doc_tokens < 2:
            raise ValueError(f"max_doc_tokens must be >= 2, got {self.max_doc_tokens}")
        probs = (self.p_delete, self.p_replace, self.p_mask, self.ict_keep_prob)
        if any(not 0.0 <= p <= 1.0 for p in probs) or self.p_delete + self.p_replace + self.p_mask > 1.0:
            raise ValueError(
                "p_delete, p_replace, p_mask and ict_keep_prob must lie in [0, 1] and "
                f"p_delete + p_replace + p_mask <= 1; got {probs}"
            )
        if self.p_replace > 0 and len(self.replace_ids) == 0:
            raise ValueError("p_replace > 0 needs a vocabulary of non-special tokens to draw from")

    @classmethod
    def from_tokenizer(cls, tokenizer, **settings) -> PairMaker:
        special = np.asarray(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)
        vocab = np.arange(len(tokenizer), dtype=np.int64)
        return cls(
            cls_id=tokenizer.cls_token_id,
            sep_id=tokenizer.sep_token_id,
            pad_id=tokenizer.pad_token_id,
            mask_id=tokenizer.mask_token_id,
            replace_ids=np.setdiff1d(vocab, special),
            **settings,
        )

    def views(self, rng: np.random.Generator, ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """The (query, key) token ids of one document, before perturbation."""
        ids = list(ids[: self.max_doc_tokens])
        if self.mode == "crop":
            return crop_pair(rng, ids, self.ratio_min, self.ratio_max)
        return ict_pair(rng, ids, self.ratio_min, self.ratio_max, self.ict_keep_prob)

    def perturb(self, rng: np.random.Generator, view: Sequence[int]) -> list[int]:
        """Token deletion, replacement and masking of one view (see the module docstring)."""
        if not (self.p_delete or self.p_replace or self.p_mask):
            return list(view)
        tokens = np.asarray(view, dtype=np.int64)
        u = rng.random(len(tokens))
        deleted = u < self.p_delete
        replaced = ~deleted & (u < self.p_delete + self.p_replace)
        masked = ~deleted & ~replaced & (u < self.p_delete + self.p_replace + self.p_mask)
        if replaced.any():
            tokens[replaced] = rng.choice(self.replace_ids, size=int(replaced.sum()))
        tokens[masked] = self.mask_id
        if deleted.all():
            deleted[0] = False
        return tokens[~deleted].tolist()

    def pair(self, rng: np.random.Generator, ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """One positive pair: two views of ``ids``, each perturbed."""
        query, key = self.views(rng, ids)
        return self.perturb(rng, query), self.perturb(rng, key)

    def pad(self, views: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[CLS] view [SEP]`` rows padded to the longest: ``(input_ids, attention_mask)``, ``[B, L]``."""
        rows = [[self.cls_id, *v, self.sep_id] for v in views]
        length = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention_mask[i, : len(row)] = 1
        return input_ids, attention_mask

    def batch(self, rng: np.random.Generator, docs: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """Query views and key views of ``docs``: row ``i`` of each comes from document ``i``.

        Returns ``q_input_ids``, ``q_attention_mask`` ``[B, Lq]`` and ``k_input_ids``,
        ``k_attention_mask`` ``[B, Lk]``, the keyword arguments of ``Contriever.forward``.
        """
        pairs = [self.pair(rng, ids) for ids in docs]
        q_ids, q_mask = self.pad([q for q, _ in pairs])
        k_ids, k_mask = self.pad([k for _, k in pairs])
        return {
            "q_input_ids": q_ids,
            "q_attention_mask": q_mask,
            "k_input_ids": k_ids,
            "k_attention_mask": k_mask,
        }
