"""Word n-gram statistics and CDMAE's average mutual information (AMI) token importance.

CDMAE (Challenging Decoder MAE, §3.2) masks the decoder input by token importance, estimated
without supervision from corpus n-gram statistics. For a word ``w_i`` of a text and window ``L``
(eq. 8)::

    AMI(w_i) = 1/(L-1) sum_{n=2..L} PMI(w_{i-n+1} .. w_i)  +  1/(L-1) sum_{n=2..L} PMI(w_i .. w_{i+n-1})

and PMI generalises the paper's bigram PMI (eq. 7) to n-grams by the full factorisation::

    PMI(w_1 .. w_n) = log p(w_1 .. w_n) - sum_k log p(w_k),     p(g) = count(g) / T_|g|

where ``T_n`` is the number of n-gram *occurrences* of order ``n`` in the corpus (a text of ``m``
words holds ``max(m - n + 1, 0)`` of them): "the number of its occurrences in the corpus divided by
the number of all the n-grams in the corpus", normalised separately for every order. Logs are
natural. Decisions where the paper is silent:

* **Per occurrence, in context.** Eq. 8 is written "for each word w_i in sentence S" over its
  neighbours, so importance belongs to a word *occurrence*: the same word gets different values
  in different texts. :func:`word_importance` returns one value per word of each text.
* **Edges, as eq. 8 writes them** (``divisor="fixed"``, the default): each side is a sum over
  the ``L - 1`` n-grams of orders ``2..L`` that end (left) or start (right) at ``w_i``, times the
  fixed ``1/(L-1)``; an n-gram that does not fit (it would run past the sentence or the text)
  contributes nothing, so an edge word's importance is pulled towards 0, as the formula says.
  ``divisor="mean"`` divides each side by the number of n-grams that fit instead (a side with
  none contributes 0), the behaviour before this followed eq. 8.
* **Inside the sentence** (eq. 8 is written "for each word w_i in sentence S"): an n-gram counts
  only if it lies inside one sentence of the text. A sentence ends at a word ``.``, ``!`` or
  ``?`` (included in it) or at the end of the text; ``sentences=False`` lets n-grams cross
  sentence ends within a text. Counting (:func:`count_shard`) is per text: the probabilities are
  corpus statistics, the sentence only bounds which n-grams a word's importance sums.
* **Unseen n-grams.** A count that is absent (an n-gram of a text outside the counted corpus, or
  one pruned below ``min_count``) is taken as 1, i.e. as if seen once. With ``min_count=2`` and
  texts from the counted corpus this is exact (pruned n-grams were seen exactly once).

Words
-----
A word is a maximal run of word characters (``str.isalnum()`` or ``_``), or any other single
non-space character (so punctuation is a word of its own, as BERT's basic tokenizer splits it),
lower-cased character by character (``str.lower`` of each character, so without the final-sigma
rule; U+0130 ``İ``, whose lower case is two characters, becomes ``i``). These are the matches of
the regular expression ``\\w+|[^\\w\\s]`` (:data:`WORD_PATTERN`) in the original text, each
lower-cased; :func:`words` is that reference. The counting path finds the same words with numpy
(ASCII texts as bytes, others through tables over code points), never creating a Python string
per word.

Scaling to MS MARCO (8.8M passages, ~0.5B words)
-------------------------------------------------
Words and n-grams are hashed to integers: a word's hash is a 64-bit hash of its lower-cased UTF-8
bytes (computed for all words of a batch at once, 8 bytes at a time), an n-gram's key is
``(order << 60) | top 60 bits of a polynomial hash of its words' hashes`` (int64, non-negative).
With ~1e9 distinct n-grams per order the expected number of colliding pairs is
~(1e9)^2 / 2^61 < 1, so counts are exact in practice; n-grams are never stored as strings
(16 bytes per distinct n-gram: key and count).

:func:`count_shard` streams texts in batches of ``batch_chars`` characters (~40 bytes of transient
memory each); a batch's keys are sorted (order by order) and run-length counted into a sorted
*run*. Runs stay in memory until they hold more than ``max_distinct`` entries in all; they are
then combined key range by key range (~1M entries at a time), and once more than half of that
is combined the rest is written to ``spill_dir`` part by part (raw int64 files, memory-mapped
back). At the end all runs are combined range by range. :func:`write_shard_counts` writes each
range to the table as it is done, so its peak memory is about 24 B x ``max_distinct`` (16 bytes
an entry, key and count, plus up to half the budget while combining) plus the batch, never the
shard's result; :func:`count_shard` also holds the result. Pages of memory-mapped runs are
dropped from the resident set after each range (:func:`_release`). Measured
(``bench/bench_scale.py --pmi``, docs/scale.md): pmi_count peaks at about 290 MB + 24 B x
``max_distinct`` from 20k to 320k passages (293 MB at 2^18, 1,068 MB at 2^25 for 29.7M distinct
n-grams). Counting is sort-based and linear in the corpus: a few million words per second on
one core, ~10x a ``collections.Counter`` of n-gram tuples (``bench/bench_pmi.py``).

Counts are never pruned while counting, so counting one shard or many and merging (:func:`merge`,
or :func:`merge_files` over saved shards, which combines memory-mapped copies range by range;
:func:`write_merged` writes the ranges as they are done, holding none of the result) gives
identical statistics. Prune with ``min_count`` once, when merging at the end; unigrams are never
pruned. Distinct n-grams (n <= 4) grow like Heaps' law on synthetic 55-word passages (exponent
0.91 with min_count 1, 0.97 with min_count 2, measured from 20k to 320k passages): about 610M
(9.8 GB as keys and counts) for MS MARCO's 8.8M passages with min_count 1, 70M (1.1 GB) with
min_count 2, which :func:`word_importance` reads by binary search.

Example::

    counts = merge(count_shard(texts[:1000]), count_shard(texts[1000:]))
    ami = word_importance(["the hokey stuff is a crossword clue"], counts)   # [array of 7 floats]
    imp = token_importance(texts, tokenizer, counts, max_length=150)         # per-token arrays
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import mmap
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

WORD_PATTERN = r"\w+|[^\w\s]"
DEFAULT_MAX_N = 4
MAX_ORDER = 7  # the order lives in bits 60..62 of a key
HASH_VERSION = 1  # bump when the word or n-gram hash changes (saved counts then no longer match)

_WORD_RE = re.compile(WORD_PATTERN)
_U64 = np.uint64
# Constants of the hashes (odd multipliers); see _hash_spans and _ngram_keys.
_CHUNK_MUL = _U64(0x9E3779B97F4A7C15)
_LEN_MUL = _U64(0x94D049BB133111EB)
_NGRAM_MUL = _U64(0xBF58476D1CE4E5B9)
_FMIX1, _FMIX2 = _U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53)
_HASH_BITS = 60
# _BYTE_MASKS[k] keeps the low k bytes of a little-endian 8-byte chunk.
_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=_U64)
# Rows of a saved table that are not n-grams (negative ``ngram``): per-order totals and settings.
_TOTAL_ROW, _MIN_COUNT_ROW, _VERSION_ROW = -1, -2, -3
_SENTINEL = -1  # key of a window that crosses a text boundary while counting


# --------------------------------------------------------------------------------------------
# Words


def words(text: str) -> list[str]:
    """The words of ``text``: the reference definition (regular expression, then lower case)."""
    return [_lower(m) for m in _WORD_RE.findall(text)]


def _lower(word: str) -> str:
    """Lower case character by character (so no final-sigma rule), keeping 1 character each."""
    return word.lower() if word.isascii() else "".join(c.lower()[0] for c in word)


def _char_classes(cps: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per code point: class (uint8: 0 space, 1 word, 2 other) and lower-cased code point (uint32)."""
    classes, lowered = [], []
    for cp in cps:
        c = chr(cp)
        classes.append(1 if (c.isalnum() or c == "_") else 0 if c.isspace() else 2)
        lowered.append(ord(c.lower()[0]))
    return np.array(classes, dtype=np.uint8), np.array(lowered, dtype=np.uint32)


@functools.cache
def _bmp_tables() -> tuple[np.ndarray, np.ndarray]:
    return _char_classes(range(0x10000))


@functools.cache
def _ascii_class_table() -> bytes:
    """``bytes.translate`` table from an ASCII byte to its class (bytes >= 128 never occur)."""
    return bytes(_bmp_tables()[0][:128].tolist()) + bytes(128)


@dataclass
class Words:
    """The words of a batch of texts, found in ``" ".join(texts)``.

    ``hashes[j]`` is word ``j``'s hash (uint64), ``starts``/``ends`` its character span in the
    joined string, ``text_starts[d]`` where text ``d`` begins there, and ``offsets[d]:offsets[d+1]``
    the words of text ``d``.
    """

    hashes: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    text_starts: np.ndarray
    offsets: np.ndarray

    def remaining(self) -> np.ndarray:
        """For each word, how many words its text still holds from it on (itself included)."""
        text_of = np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))
        return self.offsets[1:][text_of] - np.arange(len(self.hashes))


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, in place (a bijection that mixes every bit)."""
    x ^= x >> _U64(33)
    x *= _FMIX1
    x ^= x >> _U64(33)
    x *= _FMIX2
    x ^= x >> _U64(33)
    return x


def _spans(cls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Word spans from character classes: runs of class 1, and every class-2 character alone."""
    is_word = cls == 1
    other = cls == 2
    edge = np.empty(len(cls) + 1, dtype=bool)  # edge[m]: word-ness changes between m-1 and m
    edge[0] = edge[-1] = False
    if len(cls):
        np.not_equal(is_word[1:], is_word[:-1], out=edge[1:-1])
        edge[0], edge[-1] = is_word[0], is_word[-1]
    starts = np.flatnonzero((edge[:-1] & is_word) | other)
    ends = np.flatnonzero((edge[1:] & is_word) | other)
    ends += 1
    return starts, ends


def _hash_spans(data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Hash the byte strings ``data[starts[i]:ends[i]]`` (uint64), 8 bytes at a time.

    ``h = c_0``; for longer strings ``h = fmix64(h * A + c_j)`` for each further 8-byte
    little-endian chunk ``c_j`` (the last one zero-padded), then ``h ^= length * B``; finally
    ``fmix64(h)``. Words of up to 8 bytes get distinct hashes (the zero-padded bytes determine the
    word: only the one-character word NUL has a zero byte), longer ones collide with probability
    ~2^-64 per pair. Chunks are read through an unaligned strided uint64 view of the bytes, one
    gather per chunk for all words.
    """
    buf = np.frombuffer(data + bytes(8), dtype=np.uint8)
    view = np.ndarray((max(len(buf) - 7, 0),), dtype="<u8", buffer=buf, strides=(1,))
    length = ends - starts
    h = view[starts]
    h &= _BYTE_MASKS[np.minimum(length, 8)]
    long = all_long = np.flatnonzero(length > 8)
    j = 8
    while len(long):
        rest = length[long] - j
        chunk = view[starts[long] + j]
        chunk &= _BYTE_MASKS[np.minimum(rest, 8)]
        hl = h[long]
        hl *= _CHUNK_MUL
        hl += chunk
        h[long] = _fmix64(hl)
        long = long[rest > 8]
        j += 8
    h[all_long] ^= length[all_long].astype(_U64) * _LEN_MUL
    return _fmix64(h)


def split_words(texts: Sequence[str]) -> Words:
    """Find and hash the words of ``texts`` (the words of :func:`words`), vectorised.

    A word's hash is :func:`_hash_spans` of its lower-cased UTF-8 bytes, so it depends on the
    word only. Pure-ASCII input takes a fast path (``str.lower``, ``bytes.translate`` to classes);
    otherwise characters are classified and lower-cased through tables over code points and the
    lower-cased text is re-encoded as UTF-8 to locate each word's bytes.
    """
    texts = list(texts)
    try:
        joined = " ".join(texts)
    except TypeError:
        bad = next(i for i, t in enumerate(texts) if not isinstance(t, str))
        raise TypeError(f"texts must be str; item {bad} is {type(texts[bad]).__name__}") from None
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    text_starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lens + 1, out=text_starts[1:])
    if joined.isascii():
        data = joined.lower().encode("ascii")
        starts, ends = _spans(np.frombuffer(data.translate(_ascii_class_table()), dtype=np.uint8))
        hashes = _hash_spans(data, starts, ends)
    else:
        idx = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.intp)
        cls_table, lower_table = _bmp_tables()
        astral = np.flatnonzero(idx > 0xFFFF)
        if len(astral):
            uniq, inv = np.unique(idx[astral], return_inverse=True)
            idx[astral] = 0
        cls, low = cls_table[idx], lower_table[idx]
        if len(astral):
            a_cls, a_low = _char_classes(uniq.tolist())
            cls[astral], low[astral] = a_cls[inv], a_low[inv]
        starts, ends = _spans(cls)
        data = low.tobytes().decode("utf-32-le", "surrogatepass").encode("utf-8", "surrogatepass")
        nbytes = (low >= 0x80).astype(np.int64)
        nbytes += low >= 0x800
        nbytes += low >= 0x10000
        nbytes += 1
        byte_at = np.zeros(len(low) + 1, dtype=np.int64)
        np.cumsum(nbytes, out=byte_at[1:])
        hashes = _hash_spans(data, byte_at[starts], byte_at[ends])
    offsets = np.searchsorted(starts, text_starts)
    offsets[-1] = len(starts)
    return Words(hashes, starts, ends, text_starts, offsets)


def word_hashes(tokens: Sequence[str]) -> np.ndarray:
    """The hashes :func:`split_words` gives to these words (each must be one word, lower case)."""
    got = split_words(tokens)
    if len(got.hashes) != len(tokens):
        raise ValueError(f"not single words: {list(tokens)!r} splits into {len(got.hashes)} words")
    return got.hashes


# --------------------------------------------------------------------------------------------
# N-gram keys


def _ngram_keys(
    hashes: np.ndarray, max_n: int, out: np.ndarray | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """``(n, keys)`` for n = 1..max_n; ``keys[i]`` is the key of the n-gram starting at word ``i``.

    Only ``len(hashes) - n + 1`` keys per order (the n-grams that may cross text boundaries are
    included: the caller masks them). ``g_1 = h`` and ``g_n[i] = g_{n-1}[i] * M + h[i+n-1]
    (mod 2^64)``; the key keeps the top 60 bits of ``g_n`` and puts the order in bits 60..62. As
    word hashes are pseudo-random, ``g_n`` of two different n-grams differ by a uniformly
    distributed amount, so a pair collides with probability ~2^-60. With ``out`` (uint64, at
    least ``sum_n len - n + 1`` long), order n's keys are written into consecutive slices of it.
    """
    g = hashes.copy()
    at = 0
    for n in range(1, max_n + 1):
        m = len(hashes) - n + 1
        if m <= 0:
            return
        if n > 1:
            g = g[:-1]
            g *= _NGRAM_MUL
            g += hashes[n - 1 :]
        keys = np.empty(m, dtype=_U64) if out is None else out[at : at + m]
        at += m
        np.right_shift(g, _U64(64 - _HASH_BITS), out=keys)  # the high bits are the well-mixed ones
        keys |= _U64(n << _HASH_BITS)
        yield n, keys.view(np.int64)


def _n_windows(n_words: int, max_n: int) -> int:
    return sum(max(n_words - n + 1, 0) for n in range(1, max_n + 1))


def _crossing(offsets: np.ndarray, n: int) -> np.ndarray:
    """Start positions of the order-n windows that run past the end of their text (and exist)."""
    ends, lens = offsets[1:], np.diff(offsets)
    if n < 2:
        return np.zeros(0, dtype=np.int64)
    pos = np.concatenate([ends[lens >= k] - k for k in range(1, n)])
    return pos[pos <= offsets[-1] - n]


def ngram_key(tokens: Sequence[str]) -> int:
    """The key of one n-gram given as its words, e.g. ``ngram_key(["new", "york"])``."""
    if not 1 <= len(tokens) <= MAX_ORDER:
        raise ValueError(f"an n-gram has 1..{MAX_ORDER} words, got {len(tokens)}")
    *_, (_, keys) = _ngram_keys(word_hashes(tokens), len(tokens))
    return int(keys[0])


def key_order(keys: np.ndarray) -> np.ndarray:
    """The order ``n`` of each key."""
    return np.asarray(keys) >> _HASH_BITS


# --------------------------------------------------------------------------------------------
# Counts

FENCE_STRIDE = 256  # keys per block of NgramCounts.lookup's fence (a power of two)


@dataclass
class NgramCounts:
    """Exact n-gram counts of a corpus, n = 1..max_n, keyed by :func:`ngram_key`.

    ``keys`` (int64, strictly increasing, order in bits 60..62) and ``counts`` (int64) hold every
    distinct n-gram (orders >= 2 only those with count >= ``min_count``); ``totals[n]`` is ``T_n``,
    the number of n-gram occurrences of order n *before* pruning (``totals[0]`` is 0).
    """

    max_n: int
    keys: np.ndarray
    counts: np.ndarray
    totals: np.ndarray
    min_count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.max_n <= MAX_ORDER:
            raise ValueError(f"max_n must be in 1..{MAX_ORDER}, got {self.max_n}")
        self.keys = np.asarray(self.keys, dtype=np.int64)
        self.counts = np.asarray(self.counts, dtype=np.int64)
        self.totals = np.asarray(self.totals, dtype=np.int64)
        if self.keys.shape != self.counts.shape or self.totals.shape != (self.max_n + 1,):
            raise ValueError(
                f"inconsistent NgramCounts: {self.keys.shape} keys, {self.counts.shape} counts, "
                f"{self.totals.shape} totals for max_n={self.max_n} (want max_n + 1 totals)"
            )

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Counts of ``keys`` (0 where absent), vectorised.

        The distinct keys are looked up in increasing order, each in two binary searches: in
        :attr:`_fence` (every ``FENCE_STRIDE``-th key, held in memory) for its block, then inside
        that block of ``keys``, one gather per halving for all keys at once. The reads of the
        (possibly memory-mapped) table thus go forward through it, a few to a block, instead of
        ~log2(len) scattered ones per key: time per key stays about flat as the table outgrows
        the caches (docs/scale.md: 5x faster than a binary search of the unsorted keys at 16M
        rows).
        """
        keys = np.asarray(keys, dtype=np.int64)
        if not len(self.keys) or not keys.size:
            return np.zeros(keys.shape, dtype=np.int64)
        wanted, inverse = np.unique(keys.ravel(), return_inverse=True)
        # pos ends at the last row of the key's block holding a key <= it: where it is, if present.
        pos = np.searchsorted(self._fence, wanted, side="right")
        pos -= 1
        np.maximum(pos, 0, out=pos)
        pos *= FENCE_STRIDE
        last = len(self.keys) - 1
        step = FENCE_STRIDE // 2
        while step:
            probe = np.minimum(pos + step, last)  # the last block may be short
            pos = np.where(self.keys[probe] <= wanted, probe, pos)
            step //= 2
        found = np.where(self.keys[pos] == wanted, self.counts[pos], 0)
        return found[inverse].reshape(keys.shape)

    @functools.cached_property
    def _fence(self) -> np.ndarray:
        """Every ``FENCE_STRIDE``-th key, in memory (1/256 of the keys: 19 MB for 610M rows)."""
        return np.array(self.keys[::FENCE_STRIDE])

    def count(self, tokens: Sequence[str]) -> int:
        """Count of one n-gram given as its words (0 if unseen or pruned)."""
        return int(self.lookup(np.array([ngram_key(tokens)]))[0])

    def distinct(self) -> np.ndarray:
        """Number of distinct n-grams kept per order (index n; index 0 is 0)."""
        return np.bincount(key_order(self.keys), minlength=self.max_n + 1)[: self.max_n + 1]

    def equals(self, other: NgramCounts) -> bool:
        return (
            self.max_n == other.max_n
            and self.min_count == other.min_count
            and np.array_equal(self.keys, other.keys)
            and np.array_equal(self.counts, other.counts)
            and np.array_equal(self.totals, other.totals)
        )

    def to_frame(self) -> pd.DataFrame:
        """The ``ngram_counts`` table: columns ``n``, ``ngram`` (key), ``count``, sorted by ``ngram``.

        Header rows come first (negative ``ngram``): ``(n, -1, T_n)`` for each order,
        ``(0, -2, min_count)`` and ``(0, -3, HASH_VERSION)``.
        """
        return pd.concat(
            [_header_frame(self.max_n, self.totals, self.min_count), _rows_frame(self.keys, self.counts)],
            ignore_index=True,
        )

    @classmethod
    def from_frame(cls, df: pd.DataFrame, where: str = "table") -> NgramCounts:
        """Inverse of :meth:`to_frame` (checks the header rows, order and hash version)."""
        n = df["n"].to_numpy(np.int64)
        key = df["ngram"].to_numpy(np.int64)
        cnt = df["count"].to_numpy(np.int64)
        return cls._from_arrays(n, key, cnt, where)

    @classmethod
    def _from_arrays(cls, n, key, cnt, where: str) -> NgramCounts:
        head = key < 0
        header = {(int(a), int(b)): int(c) for a, b, c in zip(n[head], key[head], cnt[head], strict=True)}
        version = header.get((0, _VERSION_ROW))
        if version != HASH_VERSION:
            raise ValueError(
                f"{where}: n-gram counts of hash version {version}, this code uses {HASH_VERSION}; "
                "count the corpus again"
            )
        max_n = max((a for a, b in header if b == _TOTAL_ROW), default=0)
        totals = np.zeros(max_n + 1, dtype=np.int64)
        for (a, b), c in header.items():
            if b == _TOTAL_ROW:
                totals[a] = c
        keys, counts = key[~head], cnt[~head]
        if len(keys) > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            row = int(np.flatnonzero(keys[1:] <= keys[:-1])[0]) + 1 + int(head.sum())
            raise ValueError(f"{where}: n-gram keys not strictly increasing at row {row}")
        return cls(max_n, keys, counts, totals, min_count=header.get((0, _MIN_COUNT_ROW), 1))


def _header_frame(max_n: int, totals: np.ndarray, min_count: int) -> pd.DataFrame:
    """The header rows of an ``ngram_counts`` table (negative ``ngram``; see ``to_frame``)."""
    orders = np.arange(1, max_n + 1)
    return pd.DataFrame(
        {
            "n": np.concatenate([[0, 0], orders[::-1]]).astype(np.int32),
            "ngram": np.concatenate([[_VERSION_ROW, _MIN_COUNT_ROW], np.full(max_n, _TOTAL_ROW)]).astype(
                np.int64
            ),
            "count": np.concatenate([[HASH_VERSION, min_count], np.asarray(totals)[1:][::-1]]).astype(
                np.int64
            ),
        }
    )


def _rows_frame(keys: np.ndarray, counts: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "n": key_order(keys).astype(np.int32),
            "ngram": keys.astype(np.int64),
            "count": counts.astype(np.int64),
        }
    )


def write_counts(
    path: str | Path, max_n: int, totals: np.ndarray, parts: Iterable[Run], min_count: int = 1
) -> np.ndarray:
    """Write an ``ngram_counts`` table from sorted parts of (keys, counts), one row group per part,
    atomically, holding one part at a time; returns the distinct n-grams written per order. The
    table is the one :meth:`NgramCounts.to_frame` of the concatenated parts gives."""
    from dprflow.data.schemas import TableWriter

    distinct = np.zeros(max_n + 1, dtype=np.int64)
    with TableWriter(path, "ngram_counts") as writer:
        writer.write(_header_frame(max_n, totals, min_count))
        for keys, counts in parts:
            writer.write(_rows_frame(keys, counts))
            distinct += np.bincount(key_order(keys), minlength=max_n + 1)[: max_n + 1]
    return distinct


def _runlength(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys of a sorted array and how often each occurs."""
    if not len(sorted_keys):
        return sorted_keys, np.zeros(0, dtype=np.int64)
    first = np.empty(len(sorted_keys), dtype=bool)
    first[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    idx = np.flatnonzero(first)
    counts = np.empty(len(idx), dtype=np.int64)
    counts[:-1] = np.diff(idx)
    counts[-1] = len(sorted_keys) - idx[-1]
    return sorted_keys[idx], counts


Run = tuple[np.ndarray, np.ndarray]  # (keys strictly increasing, counts); possibly memory-mapped


PART_SIZE = 1 << 20  # entries of the runs combined at once (a key range)


def _release(arr: np.ndarray) -> None:
    """Drop the pages of a memory-mapped run from this process's resident set (they stay in the
    page cache and are read back on the next access): a run read key range by key range would
    otherwise count whole in the peak RSS a scheduler sees."""
    mapped = getattr(arr, "_mmap", None)
    if mapped is not None and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)


def _concat(parts: Sequence[Run]) -> Run:
    """Sorted parts of disjoint key ranges as one run."""
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([k for k, _ in parts]), np.concatenate([c for _, c in parts])


def _combine(runs: Sequence[Run], min_count: int = 1, part_size: int = PART_SIZE) -> Run:
    """Sum the counts of sorted runs into one run in memory (see :func:`_combine_parts`)."""
    runs = [r for r in runs if len(r[0])]
    if len(runs) == 1 and min_count <= 1:
        return np.asarray(runs[0][0]), np.asarray(runs[0][1])
    return _concat(list(_combine_parts(runs, min_count, part_size)))


def _combine_parts(runs: Sequence[Run], min_count: int = 1, part_size: int = PART_SIZE) -> Iterator[Run]:
    """Sum the counts of sorted runs, key range by key range (<= ~``part_size`` entries at once),
    yielding each range's sorted (keys, counts), new arrays (never views of the runs).

    ``min_count`` prunes orders >= 2 (unigrams are always kept).
    """
    runs = [r for r in runs if len(r[0])]
    total = sum(len(r[0]) for r in runs)
    if not runs:
        return
    if len(runs) == 1 and min_count <= 1:
        k, c = runs[0]
        for a in range(0, len(k), part_size):
            part = np.array(k[a : a + part_size]), np.array(c[a : a + part_size])
            _release(k), _release(c)
            yield part
        return
    # Key ranges of ~part_size entries: quantiles of the largest run (few reads, even if mapped).
    parts = max(1, -(-total // part_size))
    biggest = max(runs, key=lambda r: len(r[0]))[0]
    cuts = np.unique(biggest[np.linspace(0, len(biggest) - 1, parts + 1).astype(np.int64)[1:-1]])
    bounds = [0, *(int(c) for c in cuts if c > 0), 1 << 63]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        ks, cs = [], []
        for k, c in runs:
            a = int(np.searchsorted(k, lo)) if lo else 0
            b = int(np.searchsorted(k, hi)) if hi < (1 << 63) else len(k)
            if b > a:
                ks.append(np.array(k[a:b]))
                cs.append(np.array(c[a:b]))
            _release(k), _release(c)
        if not ks:
            continue
        allk = np.concatenate(ks)
        order = np.argsort(allk, kind="stable")  # timsort: fast over concatenated sorted runs
        allk = allk[order]
        csum = np.cumsum(np.concatenate(cs)[order])
        last = np.empty(len(allk), dtype=bool)  # last entry of each distinct key
        last[-1] = True
        np.not_equal(allk[1:], allk[:-1], out=last[:-1])
        idx = np.flatnonzero(last)
        k, c = allk[idx], csum[idx]
        c[1:] -= csum[idx[:-1]]
        if min_count > 1:
            keep = (c >= min_count) | (key_order(k) == 1)
            k, c = k[keep], c[keep]
        if len(k):
            yield k, c


class _SpillFile:
    """A sorted run written part by part to two raw int64 files, read back memory-mapped."""

    def __init__(self, folder: Path, stem: str):
        self.paths = [folder / f"{stem}-{name}.i64" for name in ("keys", "counts")]
        self.files = [open(p, "wb") for p in self.paths]
        self.rows = 0

    def write(self, run: Run) -> None:
        for fh, arr in zip(self.files, run, strict=True):
            np.ascontiguousarray(arr, dtype=np.int64).tofile(fh)
        self.rows += len(run[0])

    def close(self) -> Run:
        for fh in self.files:
            fh.close()
        if not self.rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return tuple(np.memmap(p, dtype=np.int64, mode="r", shape=(self.rows,)) for p in self.paths)  # type: ignore[return-value]


class _RunStore:
    """Sorted runs kept in memory up to ``max_distinct`` entries, then spilled to disk.

    Memory: the runs in memory (at most ``max_distinct`` entries plus the last batch's run) and,
    while they are combined, at most ``max_distinct / 2`` combined entries plus one key range
    before the combined run goes to disk part by part; 16 bytes an entry (key and count).
    """

    def __init__(self, max_distinct: int, spill_dir: str | Path | None):
        if max_distinct < 1:
            raise ValueError(f"max_distinct must be >= 1, got {max_distinct}")
        self.max_distinct = max_distinct
        self.spill_dir = spill_dir
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.memory: list[Run] = []
        self.spilled: list[Run] = []
        self.n_spills = 0

    def add(self, run: Run) -> None:
        self.memory.append(run)
        if sum(len(k) for k, _ in self.memory) <= self.max_distinct:
            return
        # Combine the runs; once more than half the budget is combined, the rest goes to disk
        # part by part (the combined run is never held whole).
        held: list[Run] = []
        n_held = 0
        spill: _SpillFile | None = None
        for part in _combine_parts(self.memory):
            if spill is not None:
                spill.write(part)
                continue
            held.append(part)
            n_held += len(part[0])
            if n_held > self.max_distinct // 2:
                spill = self._spill_file()
                for done in held:
                    spill.write(done)
                held = []
        self.memory = []
        if spill is not None:
            self.spilled.append(spill.close())
        elif held:
            self.memory = [_concat(held)]

    def _spill_file(self) -> _SpillFile:
        if self.spill_dir is None:
            self._tmp = self._tmp or tempfile.TemporaryDirectory(prefix="dprflow-ngrams-")
            folder = Path(self._tmp.name)
        else:
            folder = Path(self.spill_dir)
            folder.mkdir(parents=True, exist_ok=True)
        self.n_spills += 1
        return _SpillFile(folder, f"run{id(self):x}-{self.n_spills}")

    def parts(self, min_count: int = 1) -> Iterator[Run]:
        """The counts of every run, summed key range by key range; spill files removed at the end."""
        try:
            yield from _combine_parts(self.spilled + self.memory, min_count)
        finally:
            self.memory, self.spilled = [], []
            if self._tmp is not None:
                self._tmp.cleanup()
            elif self.spill_dir is not None:
                for path in Path(self.spill_dir).glob(f"run{id(self):x}-*.i64"):
                    path.unlink()

    def finish(self, min_count: int = 1) -> Run:
        if not self.spilled and len(self.memory) <= 1 and min_count <= 1:
            run, self.memory = _concat(self.memory), []
            return run
        return _concat(list(self.parts(min_count)))


def _batches(texts: Iterable[str], batch_chars: int) -> Iterator[list[str]]:
    batch: list[str] = []
    size = done = 0
    for text in texts:
        batch.append(text)
        try:
            size += len(text) + 1
        except TypeError:
            raise TypeError(
                f"texts must be str; item {done + len(batch) - 1} is {type(text).__name__}"
            ) from None
        if size >= batch_chars:
            yield batch
            done += len(batch)
            batch, size = [], 0
    if batch:
        yield batch


def count_shard(
    texts: Iterable[str],
    max_n: int = DEFAULT_MAX_N,
    *,
    batch_chars: int = 1 << 22,
    max_distinct: int = 1 << 25,
    spill_dir: str | Path | None = None,
) -> NgramCounts:
    """Count the word n-grams (n = 1..max_n) of a stream of texts; n-grams never cross texts.

    Args:
        texts: the texts (passages) of this shard, any iterable (read once, in batches).
        max_n: the largest order counted (the AMI window ``L``).
        batch_chars: characters handled at once (~40 bytes of transient memory each).
        max_distinct: distinct entries kept in memory before runs spill to ``spill_dir``.
        spill_dir: folder for spilled runs (removed when done); a temporary folder by default.

    Nothing is pruned here (see :func:`merge` for ``min_count``), so shards merge exactly.
    The result is held in memory; :func:`write_shard_counts` writes it to a table instead.
    """
    store = _RunStore(max_distinct, spill_dir)
    totals = _count_into(store, texts, max_n, batch_chars)
    keys, counts = store.finish()
    return NgramCounts(max_n, keys, counts, totals)


def write_shard_counts(
    texts: Iterable[str],
    path: str | Path,
    max_n: int = DEFAULT_MAX_N,
    *,
    batch_chars: int = 1 << 22,
    max_distinct: int = 1 << 25,
    spill_dir: str | Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`count_shard` written to an ``ngram_counts`` table at ``path`` key range by key range,
    so memory is bounded by ``max_distinct`` (about 24 bytes each at most: see :class:`_RunStore`)
    and one batch, not by the shard's distinct n-grams. Returns (totals, distinct per order)."""
    store = _RunStore(max_distinct, spill_dir)
    totals = _count_into(store, texts, max_n, batch_chars)
    return totals, write_counts(path, max_n, totals, store.parts())


def _count_into(store: _RunStore, texts: Iterable[str], max_n: int, batch_chars: int) -> np.ndarray:
    """Count the n-grams of ``texts`` batch by batch into ``store``; returns the totals ``T_n``."""
    if not 1 <= max_n <= MAX_ORDER:
        raise ValueError(f"max_n must be in 1..{MAX_ORDER}, got {max_n}")
    totals = np.zeros(max_n + 1, dtype=np.int64)
    for batch in _batches(texts, batch_chars):
        # Pure-ASCII texts take split_words' fast path; the order of texts does not matter here.
        is_ascii = [t.isascii() for t in batch]
        groups = (
            [split_words(batch)]
            if all(is_ascii)
            else [
                split_words([t for t, a in zip(batch, is_ascii, strict=True) if a]),
                split_words([t for t, a in zip(batch, is_ascii, strict=True) if not a]),
            ]
        )
        sizes = [max(len(ws.hashes) - n + 1, 0) for ws in groups for n in range(1, max_n + 1)]
        buf = np.empty(sum(sizes), dtype=_U64)
        by_order: list[list[np.ndarray]] = [[] for _ in range(max_n + 1)]
        at = 0
        for ws in groups:
            size = _n_windows(len(ws.hashes), max_n)
            lens = np.diff(ws.offsets)
            for n, keys in _ngram_keys(ws.hashes, max_n, out=buf[at : at + size]):
                keys[_crossing(ws.offsets, n)] = _SENTINEL  # sorts first; dropped below
                totals[n] += int(np.maximum(lens - n + 1, 0).sum())
                by_order[n].append(keys)
            at += size
        # Orders occupy disjoint key ranges, so per-order runs concatenate into one sorted run;
        # sorting each order apart is faster (smaller arrays) than sorting the batch at once.
        run_k, run_c = [], []
        for parts in by_order[1:]:
            if not parts:
                continue
            allk = parts[0] if len(parts) == 1 else np.concatenate(parts)
            allk.sort()
            k, c = _runlength(allk)
            if len(k) and k[0] == _SENTINEL:
                k, c = k[1:], c[1:]
            run_k.append(k)
            run_c.append(c)
        if run_k:
            store.add((np.concatenate(run_k), np.concatenate(run_c)))
    return totals


def merge(*counts: NgramCounts, min_count: int = 1) -> NgramCounts:
    """Sum n-gram counts of shards; ``min_count`` then prunes orders >= 2 (totals stay unpruned)."""
    if not counts:
        raise ValueError("merge needs at least one NgramCounts")
    max_ns = {c.max_n for c in counts}
    if len(max_ns) != 1:
        raise ValueError(f"cannot merge counts of different max_n: {sorted(max_ns)}")
    floor = max(c.min_count for c in counts)
    if floor > 1 and len(counts) > 1:
        raise ValueError(
            f"cannot merge already pruned counts (min_count={floor}): sums would be wrong; "
            "merge the unpruned shards and prune once"
        )
    keys, cnt = _combine([(c.keys, c.counts) for c in counts], min_count)
    totals = np.sum([c.totals for c in counts], axis=0)
    return NgramCounts(counts[0].max_n, keys, cnt, totals, min_count=max(min_count, floor))


def merge_files(
    paths: Sequence[str | Path],
    *,
    min_count: int = 1,
    spill_dir: str | Path | None = None,
    read_rows: int = 1 << 20,
) -> NgramCounts:
    """Merge saved shard counts (``ngram_counts`` Parquet tables) with bounded memory.

    Each file is copied, ``read_rows`` rows at a time, into memory-mapped ``.npy`` arrays under
    ``spill_dir`` (a temporary folder by default), then all are combined key range by key range;
    only the (pruned) result is held in memory at the end (:func:`write_merged` holds none of it).
    """
    with _shard_runs(paths, spill_dir, read_rows) as (runs, headers):
        keys, cnt = _combine(runs, min_count)
        keys, cnt = np.array(keys), np.array(cnt)
        del runs
    totals = np.sum([h.totals for h in headers], axis=0)
    return NgramCounts(headers[0].max_n, keys, cnt, totals, min_count=min_count)


def write_merged(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    min_count: int = 1,
    spill_dir: str | Path | None = None,
    read_rows: int = 1 << 20,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge_files` written to the ``ngram_counts`` table ``out`` key range by key range:
    memory holds one range of every shard (about ``PART_SIZE`` entries), not the result. Returns
    (totals, distinct n-grams kept per order)."""
    with _shard_runs(paths, spill_dir, read_rows) as (runs, headers):
        totals = np.sum([h.totals for h in headers], axis=0)
        max_n = headers[0].max_n
        return totals, write_counts(out, max_n, totals, _combine_parts(runs, min_count), min_count)


@contextlib.contextmanager
def _shard_runs(
    paths: Sequence[str | Path], spill_dir: str | Path | None, read_rows: int
) -> Iterator[tuple[list[Run], list[NgramCounts]]]:
    """The shards' runs copied to memory-mapped arrays (removed on exit) and their header rows
    (as empty NgramCounts), checked: schema, unpruned, sorted keys, one max_n."""
    if not paths:
        raise ValueError("merge_files needs at least one file")
    if spill_dir is not None:
        Path(spill_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dprflow-merge-", dir=spill_dir) as tmp:
        runs: list[Run] = []
        headers: list[NgramCounts] = []
        for i, path in enumerate(paths):
            header, ks, cs = _map_table(path, Path(tmp) / str(i), read_rows)
            if header.min_count > 1:
                raise ValueError(
                    f"{path}: already pruned (min_count={header.min_count}); merge unpruned shards"
                )
            headers.append(header)
            runs.append((ks, cs))
        max_ns = {h.max_n for h in headers}
        if len(max_ns) != 1:
            raise ValueError(
                f"cannot merge counts of different max_n: {sorted(max_ns)} in {list(map(str, paths))}"
            )
        yield runs, headers


def _map_table(path: str | Path, stem: Path, read_rows: int) -> tuple[NgramCounts, np.ndarray, np.ndarray]:
    """An ``ngram_counts`` table copied batch by batch into memory-mapped key and count arrays
    (``<stem>-k.npy``, ``<stem>-c.npy``): its header rows (as an empty NgramCounts), then the keys
    and counts of its n-grams, checked strictly increasing block by block. Resident memory is one
    batch, whatever the table's size."""
    import pyarrow.parquet as pq

    from dprflow.data.schemas import iter_table

    batches = iter_table(path, "ngram_counts", batch_rows=read_rows)
    first = next(batches, None)  # the file and its schema are checked here
    rows = pq.read_metadata(path).num_rows
    mk = np.lib.format.open_memmap(f"{stem}-k.npy", mode="w+", dtype=np.int64, shape=(rows,))
    mc = np.lib.format.open_memmap(f"{stem}-c.npy", mode="w+", dtype=np.int64, shape=(rows,))
    mn = np.empty(0, dtype=np.int64) if first is None else first["n"].to_numpy(np.int64)
    at = 0
    for batch in itertools.chain([] if first is None else [first], batches):
        mk[at : at + len(batch)] = batch["ngram"].to_numpy()
        mc[at : at + len(batch)] = batch["count"].to_numpy()
        at += len(batch)
        _release(mk), _release(mc)
    head = int(np.searchsorted(mk, 0))  # header rows sort first (negative keys)
    header = NgramCounts._from_arrays(mn[:head], np.asarray(mk[:head]), np.asarray(mc[:head]), str(path))
    ks = mk[head:]
    for a in range(0, len(ks), read_rows):  # block by block, each block with the last key before it
        block = np.array(ks[max(a - 1, 0) : a + read_rows])
        _release(mk)
        if len(block) > 1 and not bool(np.all(block[1:] > block[:-1])):
            raise ValueError(f"{path}: n-gram keys are not strictly increasing; was it written by to_frame?")
    return header, ks, mc[head:]


def read_counts_mapped(path: str | Path, folder: str | Path, read_rows: int = 1 << 20) -> NgramCounts:
    """The ``ngram_counts`` table at ``path`` as an NgramCounts whose keys and counts are memory
    maps in ``folder`` (which must outlive it), for the CDMAE jobs that look tokens up in it: the
    table of MS MARCO's n-grams is projected at hundreds of millions of rows (docs/scale.md), which
    ``from_frame`` would hold as a DataFrame and arrays, about 50 bytes a row. Lookups
    (:meth:`NgramCounts.lookup`, a binary search) read only the pages they touch."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    header, keys, counts = _map_table(path, Path(folder) / "ngram-counts", read_rows)
    return NgramCounts(header.max_n, keys, counts, header.totals, min_count=header.min_count)


# --------------------------------------------------------------------------------------------
# Importance (eq. 7-8)


DIVISORS = ("fixed", "mean")
_SENTENCE_END_HASHES = None


def _sentence_remaining(ws: Words) -> np.ndarray:
    """For each word, how many words its sentence still holds from it on (itself included): a
    sentence ends at a word ``.``, ``!`` or ``?`` or at the end of the text."""
    global _SENTENCE_END_HASHES
    if _SENTENCE_END_HASHES is None:
        _SENTENCE_END_HASHES = split_words([".", "!", "?"]).hashes
    n = len(ws.hashes)
    index = np.arange(n)
    is_end = np.isin(ws.hashes, _SENTENCE_END_HASHES)
    is_end[ws.offsets[1:][ws.offsets[1:] > 0] - 1] = True  # the last word of every text
    next_end = np.where(is_end, index, n)
    next_end = np.minimum.accumulate(next_end[::-1])[::-1]
    return next_end - index + 1


def _ami(
    ws: Words, stats: NgramCounts, window: int, divisor: str = "fixed", sentences: bool = True
) -> np.ndarray:
    """AMI of every word of ``ws`` (float64), see the module docstring."""
    if divisor not in DIVISORS:
        raise ValueError(f"divisor must be one of {DIVISORS}, got {divisor!r}")
    n_words = len(ws.hashes)
    ami = np.zeros(n_words)
    if n_words == 0 or window < 2:
        return ami
    remaining = np.minimum(ws.remaining(), _sentence_remaining(ws)) if sentences else ws.remaining()
    log_t = np.log(np.maximum(stats.totals, 1).astype(np.float64))
    start_sum = np.zeros(n_words)
    start_cnt = np.zeros(n_words)
    end_sum = np.zeros(n_words)
    end_cnt = np.zeros(n_words)
    cum_log_p1 = None
    for n, keys in _ngram_keys(ws.hashes, window):
        log_p = np.log(np.maximum(stats.lookup(keys), 1)) - log_t[n]
        if n == 1:
            cum_log_p1 = np.concatenate([[0.0], np.cumsum(log_p)])
            continue
        m = len(keys)
        valid = remaining[:m] >= n
        pmi = log_p - (cum_log_p1[n : n + m] - cum_log_p1[:m])
        pmi = np.where(valid, pmi, 0.0)
        start_sum[:m] += pmi
        start_cnt[:m] += valid
        end_sum[n - 1 :] += pmi  # the n-gram starting at i ends at i + n - 1
        end_cnt[n - 1 :] += valid
    if divisor == "fixed":  # eq. 8: 1/(L-1) per side, whatever fits
        return (start_sum + end_sum) / (window - 1)
    ami += np.divide(start_sum, start_cnt, out=np.zeros(n_words), where=start_cnt > 0)
    ami += np.divide(end_sum, end_cnt, out=np.zeros(n_words), where=end_cnt > 0)
    return ami


def _window(stats: NgramCounts, window: int | None) -> int:
    window = stats.max_n if window is None else window
    if not 1 <= window <= stats.max_n:
        raise ValueError(f"window must be in 1..{stats.max_n} (the counted orders), got {window}")
    return window


def word_importance(
    texts: Sequence[str],
    stats: NgramCounts,
    window: int | None = None,
    divisor: str = "fixed",
    sentences: bool = True,
) -> list[np.ndarray]:
    """AMI (eq. 8) of each word occurrence of each text, float32, aligned with :func:`words`.

    ``window`` is ``L`` (default: ``stats.max_n``; the paper uses 4); ``divisor`` and
    ``sentences``: see the module docstring (the defaults are eq. 8's).
    """
    ws = split_words(texts)
    ami = _ami(ws, stats, _window(stats, window), divisor, sentences).astype(np.float32)
    return np.split(ami, ws.offsets[1:-1])


def token_importance(
    texts: Sequence[str],
    tokenizer,
    stats: NgramCounts,
    *,
    max_length: int | None = None,
    window: int | None = None,
    special_value: float = float("-inf"),
    outside_value: float = 0.0,
    encoding=None,
    divisor: str = "fixed",
    sentences: bool = True,
) -> list[np.ndarray]:
    """Per-token importance aligned with ``tokenizer(texts, truncation=..., max_length=...)``.

    Row ``d`` has one float32 per entry of ``tokenizer(texts[d], max_length=max_length,
    truncation=max_length is not None)["input_ids"]`` (special tokens included). A token takes
    the AMI of the word its first character falls in, so all sub-word pieces of a word share its
    importance; special tokens get ``special_value`` (-inf: never preferred), and tokens outside
    every word (none for WordPiece or byte-level BPE, whose tokens start inside words) get
    ``outside_value``. AMI is computed over each whole text, truncated part included. Needs a fast
    tokenizer (character offsets). A collator that already tokenized the texts with
    ``return_offsets_mapping=True, return_special_tokens_mask=True`` can pass that result as
    ``encoding`` (``tokenizer`` is then unused) to get rows aligned with its own ``input_ids``.
    """
    texts = list(texts)
    if encoding is None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                "token_importance needs a fast (Rust) tokenizer for character offsets; "
                f"got {type(tokenizer).__name__}"
            )
        encoding = tokenizer(
            texts,
            truncation=max_length is not None,
            max_length=max_length,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
    missing = [k for k in ("offset_mapping", "special_tokens_mask") if k not in encoding]
    if missing:
        raise ValueError(
            f"encoding lacks {missing}: tokenize with return_offsets_mapping=True, return_special_tokens_mask=True"
        )
    enc = encoding
    ws = split_words(texts)
    ami = _ami(ws, stats, _window(stats, window), divisor, sentences)
    out = []
    for d, (offsets, special) in enumerate(
        zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True)
    ):
        offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        lo, hi = ws.offsets[d], ws.offsets[d + 1]
        start = offs[:, 0] + ws.text_starts[d]
        idx = np.searchsorted(ws.starts[lo:hi], start, side="right") - 1
        inside = (idx >= 0) & (offs[:, 1] > offs[:, 0])
        idx = np.clip(idx, 0, max(hi - lo - 1, 0))
        if hi > lo:
            inside &= start < ws.ends[lo:hi][idx]
            values = np.where(inside, ami[lo:hi][idx], outside_value)
        else:
            values = np.full(len(offs), outside_value)
        values[np.asarray(special, dtype=bool)] = special_value
        out.append(values.astype(np.float32))
    return out


def pad_importance(rows: Sequence[np.ndarray], length: int | None = None, pad_value: float = float("-inf")):
    """Stack per-text importance rows into a ``[B, length]`` float32 array (truncate or pad)."""
    length = max((len(r) for r in rows), default=0) if length is None else length
    out = np.full((len(rows), length), pad_value, dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : min(len(r), length)] = r[:length]
    return out
