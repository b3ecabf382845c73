"""Peak memory of exact search as the number of queries grows: one-shot vs query batches.

For every query count (default 1k, 4k, 16k, 64k) and mode, a fresh subprocess builds a
``FlatIndex`` over random unit vectors (``--corpus`` x ``--dim``), draws the queries, resets
the kernel's peak-RSS counter (``/proc/self/clear_refs``), runs one search with ``k`` results
and reports the peak RSS above the RSS just before the search (what the search itself cost,
results included). Modes:

* ``oneshot``: ``FlatIndex.search(q, k, batch_size=Q)``: faiss's result buffers hold all Q x k
  at once beside the returned arrays;
* ``batched``: ``FlatIndex.search(q, k)`` with its default query batch (4096): same return
  value, faiss buffers bounded to one batch;
* ``streamed``: ``FlatIndex.iter_search`` consumed batch by batch and dropped (how a stage that
  writes its run as it goes uses it): bounded whatever Q is.

Where ``clear_refs`` cannot be written, ``ru_maxrss`` of the child is used (the index is built
in chunks so that the build does not set a peak above the search's). Writes
results/bench/search_memory.json.

    python bench/bench_search_memory.py [--corpus 20000] [--queries 1000 4000 16000 64000]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import reset_peak_rss, status_kib  # noqa: E402

from dprflow.search.dense import SEARCH_BATCH  # noqa: E402

MODES = ("oneshot", "batched", "streamed")
KIB = 1024


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def child(args) -> dict:
    from dprflow.search.dense import FlatIndex

    rng = np.random.default_rng(args.seed)
    index = FlatIndex(args.dim)
    for start in range(0, args.corpus, 10_000):
        n = min(10_000, args.corpus - start)
        index.add(_unit(rng, n, args.dim), [f"p{i}" for i in range(start, start + n)])
    _ = index.ids  # materialise the id table before measuring
    q = _unit(rng, args.nq, args.dim)
    gc.collect()

    exact = reset_peak_rss()
    before_kib = status_kib("VmRSS")
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if args.mode == "streamed":
        checksum = 0.0
        for _, scores, _pos in index.iter_search(q, args.k, batch_size=args.batch_size):
            checksum += float(scores[:, 0].sum())
        result = None
    else:
        bs = args.nq if args.mode == "oneshot" else args.batch_size
        result = index.search(q, args.k, batch_size=bs)
    seconds = time.perf_counter() - t0
    peak_kib = status_kib("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if not exact:
        before_kib = max(before_kib, maxrss_before)
    del result
    return {
        "queries": args.nq,
        "mode": args.mode,
        "peak_delta_mib": round((peak_kib - before_kib) / KIB, 1),
        "rss_before_mib": round(before_kib / KIB, 1),
        "seconds": round(seconds, 2),
        "method": "VmHWM after clear_refs" if exact else "ru_maxrss",
        # The Q x k result itself: float32 scores + one 8-byte object pointer per id.
        "result_mib": round(args.nq * min(args.k, args.corpus) * 12 / KIB**2, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=int, default=20_000, help="passages in the index")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--queries", type=int, nargs="+", default=[1_000, 4_000, 16_000, 64_000])
    parser.add_argument(
        "--batch-size", type=int, default=SEARCH_BATCH, help="query batch of the batched modes"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nq", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0

    from _common import write_bench

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    import faiss

    points = []
    for nq in args.queries:
        for mode in MODES:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--nq",
                str(nq),
                "--mode",
                mode,
                "--corpus",
                str(args.corpus),
                "--dim",
                str(args.dim),
                "--k",
                str(args.k),
                "--batch-size",
                str(args.batch_size),
                "--seed",
                str(args.seed),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), check=False)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr)
                raise SystemExit(f"child for {nq} queries, mode {mode} failed with exit {proc.returncode}")
            point = json.loads(proc.stdout.strip().splitlines()[-1])
            logging.info("%s", point)
            points.append(point)

    by = {(p["queries"], p["mode"]): p["peak_delta_mib"] for p in points}
    largest = max(args.queries)
    batched = by.get((largest, "batched"))
    oneshot = by.get((largest, "oneshot"))
    write_bench(
        "search_memory",
        batched,
        "MiB",
        baseline=oneshot,
        ratio=round(oneshot / batched, 3) if batched and oneshot else None,
        n=largest,
        seconds=next(p["seconds"] for p in points if p["queries"] == largest and p["mode"] == "batched"),
        what=f"peak RSS increase during search of {largest} queries (value: batched, baseline: one-shot)",
        streamed_mib=by.get((largest, "streamed")),
        corpus=args.corpus,
        dim=args.dim,
        k=args.k,
        batch_size=args.batch_size,
        faiss_threads=faiss.omp_get_max_threads(),
        load_average=[round(x, 2) for x in os.getloadavg()],
        points=points,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
