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
* ``cotmae`` (CoT-MAE, Wu et al. 2022, as its reference collator ``caskcsg/ir`` ``cotmae/`` does;
  query-as-context §2.2): each document is cut once, at sentence boundaries, into contiguous
  non-overlapping spans (:func:`segment_spans`: sentences are added until the span is longer
  than a target of ``span_max`` tokens, or with probability 0.15 a random target in
  ``[span_min, span_max]``; CoT-MAE's 128 and ``short_sentence_prob`` 0.15); documents with
  fewer than two spans are skipped and counted. Each step picks an anchor span of the document
  and a context span (:func:`context_span`): ``near`` (an adjacent span), ``random`` (any other
  span), ``overlap`` (the anchor's last, or for the last span first, ``k`` sentences extended
  with the following, or preceding, sentences to ``span_max`` tokens) or ``mixed`` (one of the
  three at random per pair, the reference's default). With ``directions="both"`` (the
  reference) each pair gives two rows: the anchor is once encoded and its context decoded, and
  once the other way round (encoder rows ``[a_1, c_1, a_2, c_2, ...]``, decoder rows
  ``[c_1, a_1, c_2, a_2, ...]``); ``"one"`` keeps anchor -> context only. Spans longer than
  ``span_max`` tokens are cropped once at a random offset (the reference crops the mask and the
  ids separately, a bug not copied). Encoder ratio ``p_enc`` 0.3, decoder ``p_dec`` 0.45.

From a token store (:mod:`dprflow.data.token_store`, stage ``pretrain_tokenize``) the same items are read
lazily: :func:`store_chunks` (the chunks of :func:`chunk_texts`) and :func:`store_cotmae_documents`
(the documents of :func:`cotmae_documents`, cut with the same generator draws).

Both masks select exactly ``floor(n * p)`` of the ``n`` non-special tokens of a row, then apply
BERT's 80/10/10 replacement. Every draw comes from the batch's own generator (resume-safe).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from dprflow.pretraining.mae import pmi
from dprflow.pretraining.mae.importance_masking import importance_mask, random_mask
from dprflow.pretraining.masking import generator_from, special_tokens_mask

log = logging.getLogger(__name__)

VARIANTS = ("bmae", "cdmae", "cotmae")
CONTEXTS = ("near", "random", "overlap", "mixed")
DIRECTIONS = ("both", "one")
SHORT_SPAN_PROB = 0.15  # CoT-MAE make_cotmae_data.py short_sentence_prob: a shorter random target


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


class CotDocument(NamedTuple):
    """A document cut into sentences and CoT-MAE spans (token offsets, no special tokens)."""

    ids: np.ndarray  # [n] int64, the document's tokens
    sentences: np.ndarray  # [m + 1] token offset of each sentence start, then n
    spans: np.ndarray  # [k + 1] sentence index of each span start, then m (k >= 2)


def tokenize_sentences(
    texts: Sequence[str], tokenizer, batch_size: int = 1024
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each text's tokens (no special tokens) and its sentence offsets ``[m + 1]``: the sentences
    of :func:`dprflow.data.passages.split_sentences`, tokenized one by one (WordPiece splits at
    white space, so their concatenation is the text's tokenization)."""
    from dprflow.data.passages import split_sentences

    sentences = [split_sentences(t) for t in texts]
    flat = [s for doc in sentences for s in doc]
    ids: list[list[int]] = []
    for start in range(0, len(flat), batch_size):
        ids.extend(tokenizer(flat[start : start + batch_size], add_special_tokens=False)["input_ids"])
    out, at = [], 0
    for doc in sentences:
        pieces = [p for p in ids[at : at + len(doc)] if p]  # empty sentences skipped (reference)
        at += len(doc)
        lengths = [len(p) for p in pieces]
        tokens = np.asarray([t for p in pieces for t in p], dtype=np.int64)
        out.append((tokens, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])))
    return out


def segment_spans(
    rng: np.random.Generator, sentence_lengths: Sequence[int], span_min: int, span_max: int
) -> np.ndarray:
    """Sentence indices ``[k + 1]`` cutting a document into contiguous spans (CoT-MAE
    ``_base_encode_one_span``): whole sentences are added to a span until it holds *more* than
    its target, ``span_max`` tokens, or with probability 0.15 a random target in ``[span_min,
    span_max]``; the last span holds the rest. A span may so overshoot by one sentence (cropped
    to ``span_max`` when used)."""
    bounds = [0]
    length = 0
    target = _span_target(rng, span_min, span_max)
    for i, n in enumerate(sentence_lengths):
        length += n
        if length > target:
            bounds.append(i + 1)
            length = 0
            target = _span_target(rng, span_min, span_max)
    if bounds[-1] != len(sentence_lengths):
        bounds.append(len(sentence_lengths))
    return np.asarray(bounds, dtype=np.int64)


def _span_target(rng: np.random.Generator, span_min: int, span_max: int) -> int:
    if rng.random() < SHORT_SPAN_PROB:
        return int(rng.integers(span_min, span_max + 1))
    return span_max


def cotmae_documents(
    texts: Sequence[str], tokenizer, rng: np.random.Generator, span_min: int, span_max: int
) -> tuple[list[CotDocument], dict[str, int]]:
    """The documents CoT-MAE trains on, each cut once into spans (:func:`segment_spans`), and
    the counts of what was kept: documents with fewer than two spans are skipped (reference)."""
    docs, skipped = [], 0
    for ids, sentences in tokenize_sentences(texts, tokenizer):
        spans = segment_spans(rng, np.diff(sentences), span_min, span_max)
        if len(spans) < 3:
            skipped += 1
            continue
        docs.append(CotDocument(ids, sentences, spans))
    counts = {"documents": len(texts), "documents_with_fewer_than_two_spans_skipped": skipped}
    counts["training_documents"] = len(docs)
    return docs, counts


def token_text(store, start: int, stop: int) -> TokenText:
    """The chunk ``[start, stop)`` of a token store, with its importance when the store has it."""
    ids = np.asarray(store.tokens[start:stop], dtype=np.int64)
    return TokenText(ids, None if store.importance is None else np.asarray(store.importance[start:stop]))


def store_chunks(store, length: int, min_length: int = 8):
    """:func:`chunk_texts` of a token store, read per batch: ``(chunks, dropped)``."""
    from dprflow.data.token_store import Ranges, chunk_ranges

    starts, stops, dropped = chunk_ranges(store, length, min_length)
    return Ranges(store, starts, stops, token_text), dropped


class CotDocuments(Sequence):
    """CoT-MAE documents of a token store with sentence cuts (:func:`store_cotmae_documents`):
    item ``i`` is the :class:`CotDocument` of store document ``docs[i]``, its spans
    ``spans[span_offsets[i]:span_offsets[i + 1]]`` (a memory map)."""

    def __init__(self, store, docs: np.ndarray, spans: np.ndarray, span_offsets: np.ndarray) -> None:
        self.store, self.docs, self.spans, self.span_offsets = store, docs, spans, span_offsets

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> CotDocument:
        d = int(self.docs[i])
        start, stop = int(self.store.offsets[d]), int(self.store.offsets[d + 1])
        first, last = int(self.store.doc_sentences[d]), int(self.store.doc_sentences[d + 1])
        sentences = np.append(np.asarray(self.store.sentences[first:last]) - start, stop - start)
        spans = np.asarray(self.spans[self.span_offsets[i] : self.span_offsets[i + 1]])
        return CotDocument(np.asarray(self.store.tokens[start:stop], dtype=np.int64), sentences, spans)


def store_cotmae_documents(
    store, rng: np.random.Generator, span_min: int, span_max: int, scratch=None, block: int = 1 << 16
) -> tuple[CotDocuments, dict[str, int]]:
    """:func:`cotmae_documents` of a token store written with sentence cuts: the same spans (the
    same generator draws, document by document). The sentence cuts are read ``block`` documents
    at a time from the memory map, and the spans (about one per ``span_max`` tokens) are written
    to an unnamed temporary file in ``scratch`` (default: the system's) and memory-mapped: what
    stays resident is 16 bytes per kept document (its store index and its first span)."""
    import array
    import tempfile

    if store.sentences is None:
        raise ValueError(f"{store.path}: CoT-MAE needs a token store with sentence cuts (a *-sentences view)")
    if scratch is not None:
        os.makedirs(scratch, exist_ok=True)
    kept, span_offsets, pending = array.array("q"), array.array("q", [0]), array.array("q")
    n_spans = 0
    with tempfile.TemporaryFile(dir=scratch) as fh:
        for b in range(0, len(store), block):
            firsts = np.asarray(store.doc_sentences[b : min(b + block, len(store)) + 1])
            # the last sentence of a document ends where the next one starts (the array's last entry: n)
            lengths = np.diff(np.asarray(store.sentences[firsts[0] : firsts[-1] + 1]))
            firsts = firsts - firsts[0]
            for j in range(len(firsts) - 1):
                cut = segment_spans(rng, lengths[firsts[j] : firsts[j + 1]], span_min, span_max)
                if len(cut) < 3:
                    continue
                kept.append(b + j)
                pending.extend(cut.tolist())
                n_spans += len(cut)
                span_offsets.append(n_spans)
            fh.write(pending.tobytes())
            del pending[:]
        fh.flush()
        spans = np.memmap(fh, np.int64, mode="r") if n_spans else np.zeros(0, np.int64)
    n = len(store)
    counts = {"documents": n, "documents_with_fewer_than_two_spans_skipped": n - len(kept)}
    counts["training_documents"] = len(kept)
    return CotDocuments(
        store, np.frombuffer(kept, np.int64), spans, np.frombuffer(span_offsets, np.int64)
    ), counts


def context_span(
    doc: CotDocument, anchor: int, mode: str, rng: np.random.Generator, span_max: int
) -> tuple[int, int]:
    """``[start, stop)`` token offsets of the context of span ``anchor`` (CoT-MAE
    ``make_cotmae_data.py``): ``near`` an adjacent span; ``random`` any other span; ``overlap``
    the last ``k`` sentences of the anchor (the first ``k`` for the last span), ``k`` uniform in
    ``1..s//2`` for an anchor of ``s`` sentences (1 when ``s//2 < 2``), extended by the following
    (preceding) sentences until it holds ``span_max`` tokens; ``mixed`` one of the three at random."""
    n_spans = len(doc.spans) - 1
    if mode == "mixed":
        mode = ("near", "random", "overlap")[int(rng.integers(3))]
    if mode in ("near", "random"):
        if mode == "near":
            choices = [i for i in (anchor - 1, anchor + 1) if 0 <= i < n_spans]
        else:
            choices = [i for i in range(n_spans) if i != anchor]
        other = choices[int(rng.integers(len(choices)))]
        return int(doc.sentences[doc.spans[other]]), int(doc.sentences[doc.spans[other + 1]])
    if mode != "overlap":
        raise ValueError(f"context must be one of {CONTEXTS}, got {mode!r}")
    first, stop = int(doc.spans[anchor]), int(doc.spans[anchor + 1])  # sentence indices
    half = (stop - first) // 2
    k = int(rng.integers(1, half + 1)) if half >= 2 else 1
    n_sentences = len(doc.sentences) - 1
    if anchor < n_spans - 1:  # the anchor's last k sentences, then the following ones
        lo, hi = stop - k, stop
        while hi < n_sentences and doc.sentences[hi] - doc.sentences[lo] < span_max:
            hi += 1
    else:  # the last span: its first k sentences, then the preceding ones
        lo, hi = first, first + k
        while lo > 0 and doc.sentences[hi] - doc.sentences[lo] < span_max:
            lo -= 1
    return int(doc.sentences[lo]), int(doc.sentences[hi])


def crop(rng: np.random.Generator, start: int, stop: int, span_max: int) -> tuple[int, int]:
    """A random window of ``span_max`` tokens of ``[start, stop)`` when it is longer."""
    if stop - start <= span_max:
        return start, stop
    offset = int(rng.integers(0, stop - start - span_max + 1))
    return start + offset, start + offset + span_max


def cotmae_rows(
    docs: Sequence[CotDocument], rng: np.random.Generator, span_max: int, context: str, directions: str
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Encoder and decoder rows of a CoT-MAE batch (module docstring): per document an anchor
    span uniformly and its context; ``both`` directions gives rows ``2i`` (anchor -> context)
    and ``2i + 1`` (context -> anchor)."""
    if directions not in DIRECTIONS:
        raise ValueError(f"directions must be one of {DIRECTIONS}, got {directions!r}")
    enc, dec = [], []
    for doc in docs:
        anchor = int(rng.integers(len(doc.spans) - 1))
        a = crop(
            rng, int(doc.sentences[doc.spans[anchor]]), int(doc.sentences[doc.spans[anchor + 1]]), span_max
        )
        c = crop(rng, *context_span(doc, anchor, context, rng, span_max), span_max)
        a_ids, c_ids = doc.ids[a[0] : a[1]], doc.ids[c[0] : c[1]]
        enc.append(a_ids)
        dec.append(c_ids)
        if directions == "both":
            enc.append(c_ids)
            dec.append(a_ids)
    return enc, dec


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
    span_max: int = 64,
    context: str = "mixed",
    directions: str = "both",
) -> dict[str, torch.Tensor]:
    """The encoder and decoder inputs and labels of one batch (see the module docstring): the
    keyword arguments of :meth:`BottleneckedMAE.forward`.

    ``items`` are chunks (``bmae``, ``cdmae``; ``cdmae`` needs their importance) or
    :class:`CotDocument` s (``cotmae``, :func:`cotmae_documents`).
    """
    if variant == "cotmae":
        enc_rows, dec_rows = cotmae_rows(items, rng, span_max, context, directions)
        return pair_mae_batch(enc_rows, dec_rows, tokenizer, rng, p_enc=p_enc, p_dec=p_dec)
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
    """The keyword arguments of :meth:`BottleneckedMAE.forward`."""
    return dict(
        enc_input_ids=enc_input,
        enc_attention_mask=enc_attention,
        enc_labels=enc_labels,
        dec_input_ids=dec_input,
        dec_attention_mask=dec_attention,
        dec_labels=dec_labels,
    )
