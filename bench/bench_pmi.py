"""N-gram counting throughput for CDMAE's PMI statistics (``dprflow.pretraining.mae.pmi.count_shard``), n = 1..4.

Usage::

    python bench/bench_pmi.py [--words 3000000] [--max-n 4] [--repeats 1]

The corpus is real text available offline: the paragraphs (blank-line separated blocks) of the
Python standard library's source files, code and docstrings and comments, in file order, cut at
``--words`` words (pydoc's help topics, plain English, come first). Everything runs on one core:
numpy does not multithread these operations.

Figures (``results/bench/``):

* ``pmi_count_words_per_s``: words per second of ``count_shard`` from text to counts, beside
  ``baseline``: a plain ``collections.Counter`` over the n-grams of ``re.findall(WORD_PATTERN,
  text.lower())`` of every text, in the same run (``ratio`` = ours / baseline, target >= 10). Both
  include finding the words; the number of distinct n-grams and the per-order totals of the two
  are checked to agree, and a sample of counts is compared n-gram by n-gram.
* ``pmi_count_peak_rss``: peak resident memory (MiB) of a fresh process that loads the corpus and
  counts it once (``count_shard`` defaults), with the peak after loading the corpus alone as
  ``corpus_rss_mib``: the difference is what counting costs.
* ``pmi_count_scaling``: time of the corpus repeated 4 times over time of the corpus once
  (target <= 4.4: counting is linear in the corpus).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path

from _common import write_bench

from dprflow.pretraining.mae import pmi


def stdlib_paragraphs(max_words: int) -> list[str]:
    """pydoc's topics, then blank-line separated paragraphs of stdlib sources, ~``max_words`` words."""
    import pydoc_data.topics

    texts = [t for t in pydoc_data.topics.topics.values() if t.strip()]
    n = sum(len(pmi.words(t)) for t in texts)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        try:
            source = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for para in re.split(r"\n\s*\n", source):
            if para.strip():
                texts.append(para)
                n += len(para) // 5  # ~5 characters per word; the exact count is taken below
        if n >= max_words:
            break
    return texts


def counter_baseline(texts: list[str], max_n: int) -> Counter:
    word_re = re.compile(pmi.WORD_PATTERN)
    counts: Counter = Counter()
    for text in texts:
        w = word_re.findall(text.lower())
        for n in range(1, max_n + 1):
            counts.update(zip(*(w[i:] for i in range(n)), strict=False))
    return counts


def rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def rss_child(words: int, max_n: int) -> int:
    """Run in a fresh process: load the corpus, count it once, print peak RSS before and after."""
    texts = stdlib_paragraphs(words)
    before = rss_mib()
    counts = pmi.count_shard(texts, max_n)
    print(json.dumps({"corpus_rss_mib": before, "peak_rss_mib": rss_mib(), "distinct": len(counts)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--words", type=int, default=3_000_000, help="corpus size in words (about)")
    ap.add_argument("--max-n", type=int, default=4, help="largest n-gram order counted")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each measurement (best is kept)")
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rss_child:
        return rss_child(args.words, args.max_n)

    child = subprocess.run(
        [sys.executable, __file__, "--rss-child", "--words", str(args.words), "--max-n", str(args.max_n)],
        capture_output=True,
        text=True,
        check=True,
    )
    memory = json.loads(child.stdout.strip().splitlines()[-1])

    texts = stdlib_paragraphs(args.words)
    n_chars = sum(map(len, texts))
    pmi.count_shard(texts[:200], args.max_n)  # warm-up: character tables

    seconds, ours = timed(lambda: pmi.count_shard(texts, args.max_n), args.repeats)
    n_words = int(ours.totals[1])  # every word is one unigram occurrence
    print(f"corpus: {len(texts)} texts, {n_words} words, {n_chars} characters")
    seconds4, ours4 = timed(lambda: pmi.count_shard(texts * 4, args.max_n), args.repeats)
    base_seconds, ref = timed(lambda: counter_baseline(texts, args.max_n), args.repeats)

    # The two agree: totals and distinct n-grams per order, and a sample of individual counts.
    ref_totals = [0] * (args.max_n + 1)
    ref_distinct = [0] * (args.max_n + 1)
    for gram, c in ref.items():
        ref_totals[len(gram)] += c
        ref_distinct[len(gram)] += 1
    sample = random.Random(0).sample(sorted(ref), 2000)
    mismatches = sum(ours.count(list(g)) != ref[g] for g in sample)
    agree = (
        ref_totals == ours.totals.tolist() and ref_distinct == ours.distinct().tolist() and mismatches == 0
    )
    if not agree:
        print(
            f"WARNING: counts differ from the Counter baseline: totals {ours.totals.tolist()} vs {ref_totals}, "
            f"distinct {ours.distinct().tolist()} vs {ref_distinct}, {mismatches}/2000 sampled counts",
            file=sys.stderr,
        )
    assert (ours4.counts.sum(), len(ours4)) == (4 * ours.counts.sum(), len(ours))

    ours_wps, base_wps = n_words / seconds, n_words / base_seconds
    write_bench(
        "pmi_count_words_per_s",
        ours_wps,
        "words/s",
        baseline=base_wps,
        baseline_impl="collections.Counter over n-gram tuples of re.findall(WORD_PATTERN, text.lower())",
        ratio=ours_wps / base_wps,
        target=">= 10 x baseline",
        n=n_words,
        seconds=seconds,
        baseline_seconds=base_seconds,
        max_n=args.max_n,
        distinct_ngrams=len(ours),
        counts_agree=agree,
        corpus="pydoc topics + stdlib source paragraphs",
        load_average=os.getloadavg()[0],
    )
    write_bench(
        "pmi_count_peak_rss",
        memory["peak_rss_mib"],
        "MiB",
        corpus_rss_mib=memory["corpus_rss_mib"],
        counting_mib=memory["peak_rss_mib"] - memory["corpus_rss_mib"],
        n=n_words,
        distinct_ngrams=memory["distinct"],
        result_mib=16 * memory["distinct"] / 2**20,
        note="ru_maxrss of a fresh process after loading the corpus and after count_shard",
    )
    write_bench(
        "pmi_count_scaling",
        seconds4 / seconds,
        "x",
        target="<= 4.4 for 4x the corpus",
        n=4 * n_words,
        seconds=seconds4,
        seconds_1x=seconds,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
