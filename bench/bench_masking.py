"""Latency of CDMAE's importance-aware masking beside uniform random masking, on CPU.

Usage::

    python bench/bench_masking.py [--batch 128] [--length 150] [--repeats 3000] [--p 0.5]

CDMAE's Table 6 times masking a batch of 128 sequences of 150 tokens: 0.4 ms for (random) MAE
masking and 1.1 ms for CDMAE on CPU. This script times ``importance_mask`` and ``random_mask``
(80/10/10 replacement and special-token handling included) on the same kind of batch, interleaved
in the same run, and reports the median over ``--repeats`` calls after a warm-up, with torch's
intra-op threads as set in the environment (``torch.get_num_threads()`` is recorded).

The batch is what the pre-training collator would hand over: [CLS] text [SEP] followed by
padding, lengths drawn uniformly from 64..150 (``--full`` makes every row 150 tokens long),
a WordPiece-sized vocabulary, and importance of the scale of AMI values (normal, sd 3).

Figures (``results/bench/``): ``masking_importance_ms`` (target <= 0.55 ms and <= 3 x random
masking in the same run) and ``masking_random_ms``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _common import write_bench

from dprflow.pretraining.mae.importance_masking import importance_mask, random_mask

VOCAB, CLS, SEP, PAD, MASK = 30522, 101, 102, 0, 103


def make_batch(batch: int, length: int, full: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.full((batch,), length) if full else torch.randint(64, length + 1, (batch,), generator=g)
    pos = torch.arange(length)[None, :]
    ids = torch.randint(1000, VOCAB, (batch, length), generator=g)
    ids[pos >= lens[:, None]] = PAD
    ids[:, 0] = CLS
    ids[torch.arange(batch), lens - 1] = SEP
    special = (ids == CLS) | (ids == SEP) | (ids == PAD)
    importance = torch.randn(batch, length, generator=g) * 3.0
    importance[special] = float("-inf")
    return ids, importance, special


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--length", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3000, help="timed calls of each function")
    ap.add_argument("--p", type=float, default=0.5, help="masking ratio (CDMAE's decoder: 0.5)")
    ap.add_argument("--full", action="store_true", help="every row full length (no padding)")
    args = ap.parse_args(argv)

    ids, importance, special = make_batch(args.batch, args.length, args.full)
    g = torch.Generator().manual_seed(1)

    def run_importance():
        return importance_mask(ids, importance, special, args.p, MASK, VOCAB, g)

    def run_random():
        return random_mask(ids, special, args.p, MASK, VOCAB, g)

    for _ in range(100):  # warm-up
        run_importance()
        run_random()
    times: dict[str, list[float]] = {"importance": [], "random": []}
    t_start = time.perf_counter()
    for _ in range(args.repeats):
        for name, fn in (("importance", run_importance), ("random", run_random)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    total = time.perf_counter() - t_start

    med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    p90 = {name: statistics.quantiles(ts, n=10)[-1] * 1e3 for name, ts in times.items()}
    fastest = {name: min(ts) * 1e3 for name, ts in times.items()}
    masked, labels = run_importance()
    n_masked = int((labels != -100).sum())
    shape = {"batch": args.batch, "length": args.length, "p": args.p, "full_rows": args.full}
    write_bench(
        "masking_importance_ms",
        med["importance"],
        "ms",
        p90_ms=p90["importance"],
        min_ms=fastest["importance"],
        baseline=med["random"],
        baseline_impl="random_mask (same 80/10/10 and special handling, uniform scores)",
        ratio=med["importance"] / med["random"],
        target="<= 0.55 ms and <= 3 x random_mask",
        paper_cpu_ms={"MAE": 0.4, "CDMAE": 1.1},
        n=args.repeats,
        seconds=total,
        tokens_masked_per_batch=n_masked,
        load_average=os.getloadavg()[0],
        **shape,
    )
    write_bench(
        "masking_random_ms",
        med["random"],
        "ms",
        p90_ms=p90["random"],
        min_ms=fastest["random"],
        paper_cpu_ms=0.4,
        n=args.repeats,
        seconds=total,
        **shape,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
