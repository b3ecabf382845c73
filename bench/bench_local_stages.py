"""Benchmark: peak memory of the two stages that run where Snakemake runs (mine_negatives, evaluate).

Both are ``localrules`` (Snakefile), so a login node's per-process cap, not a cluster job's
request, bounds them. This writes their inputs directly as Parquet at MS MARCO's shape per passage
(bench_scale.py's ratios: 0.057 training and 0.001 test queries a passage, one relevant document
each; mining depth 200, search depth 1000; one passage per document unless
``--passages-per-doc``), runs each stage module in a fresh process and reads its peak RSS from
``wait4`` (``ru_maxrss``). No model, no tokenizer: the passages' text is empty (neither stage reads
it). The runs keep the queries table's order (query_id not sorted: q0, q1, ... q10), as
search_dense writes them, one row group per 4,096 queries. Seconds and peak RSS per stage and size,
and a line through the two largest sizes to MS MARCO (8.8M passages), go to
``results/bench/local_stages/<label>.json``; the projections also as figures
(``local_<stage>_msmarco_mb``).

    python bench/bench_local_stages.py --passages 40000,160000,640000,1280000
    python bench/bench_local_stages.py --passages 8841823 --train-run-queries 72809

The second is MS MARCO's own size with the training run cut to the first 72,809 queries (the
judgments stay whole). Inputs and outputs go to ``<work>/<passages>-<passages a doc>[-<train run
queries>]/<label>/``: run it with ``PYTHONPATH`` at another checkout's ``src`` and another
``--label`` to compare two versions' peaks and files (``cmp``) on the same inputs
(bench/RESULTS.md, "The local stages").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import ROOT, bench_dir, machine, write_bench

MSMARCO_PASSAGES = 8_841_823
TRAIN_PER_PASSAGE = 502_939 / MSMARCO_PASSAGES
TEST_PER_PASSAGE = 0.001
MINING_DEPTH = 200
SEARCH_DEPTH = 1000
ROW_GROUP_QUERIES = 4096
SEED = 13


def _prime_above(n: int) -> int:
    """The smallest prime above ``n``: a stride that visits ``n`` passages without repeating."""
    p = n + 1
    while any(p % d == 0 for d in range(2, int(p**0.5) + 1)):
        p += 1
    return p


def _write(path: Path, table: pa.Table, rows_per_group: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, row_group_size=rows_per_group)
    os.replace(tmp, path)


def _run(qids: pa.Array, pids: pa.Array, first: int, n_queries: int, depth: int, per_doc: int, rng) -> tuple:
    """A run of queries ``first..first+n_queries-1`` at ``depth``: distinct passages per query (a
    prime stride from a random start; with several passages a document, consecutive passages, so
    that a document's passages meet in a query's run and MaxP merges them), scores falling with
    rank at 3 decimals (some ties)."""
    n = len(pids)
    stride = 1 if per_doc > 1 else _prime_above(max(n, depth))
    start = rng.integers(0, n, n_queries)
    rows = (start[:, None] + stride * np.arange(depth)[None, :]) % n
    noise = rng.random((n_queries, depth)) * 0.002
    score = np.round(1.0 - np.arange(depth)[None, :] / depth + noise, 3).astype(np.float32)
    table = pa.table(
        {
            "query_id": qids.take(pa.array(np.repeat(np.arange(first, first + n_queries), depth))),
            "passage_id": pids.take(pa.array(rows.ravel())),
            "score": pa.array(score.ravel(), pa.float32()),
            "rank": pa.array(np.tile(np.arange(1, depth + 1, dtype=np.int32), n_queries)),
        }
    )
    return table, rows


def make_inputs(folder: Path, n_passages: int, per_doc: int, train_run_queries: int = 0) -> dict[str, int]:
    """passages, queries, qrels, train_run (training queries at the mining depth; only the first
    ``train_run_queries`` if set) and run (test queries at the search depth) of ``n_passages``
    passages, in ``folder`` (kept once written)."""
    done = folder / "inputs.json"
    if done.exists():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    n_docs = -(-n_passages // per_doc)
    doc_of = np.arange(n_passages) // per_doc
    position = (np.arange(n_passages) % per_doc).astype(np.int32)
    pids = pa.array([f"d{d}#{p}" for d, p in zip(doc_of.tolist(), position.tolist(), strict=True)])
    dids = pa.array([f"d{d}" for d in range(n_docs)])
    empty = pa.array([""] * n_passages)
    passages = pa.table(
        {
            "passage_id": pids,
            "doc_id": dids.take(pa.array(doc_of)),
            "position": pa.array(position),
            "title": empty,
            "text": empty,
            "n_tokens": pa.array(np.zeros(n_passages, np.int32)),
        }
    )
    _write(folder / "passages.parquet", passages, 1 << 16)
    n_train = round(n_passages * TRAIN_PER_PASSAGE)
    n_test = max(10, round(n_passages * TEST_PER_PASSAGE))
    n_queries = n_train + n_test
    qids = pa.array([f"q{i}" for i in range(n_queries)])
    split = ["train"] * n_train + ["test"] * n_test
    queries = pa.table({"query_id": qids, "text": pa.array(["a b c"] * n_queries), "split": split})
    _write(folder / "queries.parquet", queries, 1 << 20)
    n_run = min(n_train, train_run_queries) if train_run_queries else n_train
    train, train_rows = _run(qids, pids, 0, n_run, MINING_DEPTH, per_doc, rng)
    # The queries the train run leaves out find their relevant documents at random.
    train_rows = np.concatenate([train_rows[:, :100], rng.integers(0, n_passages, (n_train - n_run, 100))])
    test, test_rows = _run(qids, pids, n_train, n_test, SEARCH_DEPTH, per_doc, rng)
    _write(folder / "train_run.parquet", train, ROW_GROUP_QUERIES * MINING_DEPTH)
    _write(folder / "run.parquet", test, ROW_GROUP_QUERIES * SEARCH_DEPTH)
    # One relevant document a query: for half of them a passage the run found (at a random
    # rank), for the others a random document.
    found = np.concatenate([train_rows, test_rows[:, :100]])
    found = found[np.arange(n_queries), rng.integers(0, 100, n_queries)]
    relevant = np.where(rng.random(n_queries) < 0.5, doc_of[found], rng.integers(0, n_docs, n_queries))
    qrels = pa.table(
        {
            "query_id": qids,
            "doc_id": dids.take(pa.array(relevant)),
            "relevance": pa.array(np.ones(n_queries, np.int32)),
        }
    )
    _write(folder / "qrels.parquet", qrels, 1 << 20)
    info = {
        "passages": n_passages,
        "documents": n_docs,
        "train_queries": n_train,
        "train_run_queries": n_run,
        "test_queries": n_test,
        "train_run_rows": len(train),
        "run_rows": len(test),
    }
    done.write_text(json.dumps(info, indent=2) + "\n")
    return info


def stage_argv(stage: str, inputs: Path, out: Path) -> list[str]:
    if stage == "mine_negatives":
        return [
            *("--run", str(inputs / "train_run.parquet"), "--qrels", str(inputs / "qrels.parquet")),
            *("--passages", str(inputs / "passages.parquet"), "--out", str(out / "negatives.parquet")),
            *("--depth", str(MINING_DEPTH)),
        ]
    if stage == "evaluate":
        return [
            *("--run", str(inputs / "run.parquet"), "--passages", str(inputs / "passages.parquet")),
            *("--queries", str(inputs / "queries.parquet"), "--qrels", str(inputs / "qrels.parquet")),
            *("--split", "test", "--out", str(out / "metrics.parquet")),
            *("--doc-run", str(out / "run.doc.trec")),
        ]
    raise ValueError(f"unknown stage {stage!r}; known: mine_negatives, evaluate")


# The stage runs as the grandchild of a bare interpreter: a process started from this one inherits
# this one's peak RSS as its own ru_maxrss floor (Linux keeps it across exec, and subprocess
# spawns with vfork), which the inputs just generated here would set; a fork of the bare helper
# starts from the helper's few MB.
MEASURE = """
import json, os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "seconds": time.perf_counter() - start,
                  "maxrss_kib": usage.ru_maxrss}))
"""


def measure(stage: str, inputs: Path, out: Path) -> dict:
    """Run the stage module in a fresh process: seconds and its peak RSS (``ru_maxrss`` of wait4)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", MEASURE, "-m", f"dprflow.stages.{stage}", *stage_argv(stage, inputs, out)]
    with open(out / f"{stage}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=os.environ.copy())
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["rc"] != 0:
        raise SystemExit(f"{stage} failed: see {out / f'{stage}.log'}")
    return {"seconds": round(result["seconds"], 2), "peak_mb": round(result["maxrss_kib"] / 1024, 1)}


def project(records: list[dict], stage: str) -> dict:
    """The line through the two largest sizes' peaks, at MS MARCO's passage count."""
    mine = sorted((r for r in records if r["stage"] == stage), key=lambda r: r["passages"])
    if len(mine) < 2:
        return {"stage": stage}
    a, b = mine[-2], mine[-1]
    slope = (b["peak_mb"] - a["peak_mb"]) / (b["passages"] - a["passages"])
    return {
        "stage": stage,
        "mb_per_million_passages": round(slope * 1e6, 1),
        "msmarco_mb": round(b["peak_mb"] + slope * (MSMARCO_PASSAGES - b["passages"]), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", default="40000,160000,640000", help="comma-separated passage counts")
    parser.add_argument("--stages", default="mine_negatives,evaluate", help="comma-separated stages")
    parser.add_argument("--passages-per-doc", type=int, default=1, help="passages of each document")
    parser.add_argument(
        "--work", default=str(ROOT / "results" / "bench" / "local-stages"), help="inputs and outputs"
    )
    parser.add_argument(
        "--train-run-queries",
        type=int,
        default=0,
        help="training queries the train run covers (0: all); the queries and qrels stay whole: "
        "MS MARCO's 502k training judgments beside a run of a bounded size",
    )
    parser.add_argument("--label", default="current", help="folder of this run's outputs under each size")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.passages.split(",") if s.strip()]
    stages = [s for s in args.stages.split(",") if s.strip()]
    work = Path(args.work)
    records = []
    for n in sizes:
        inputs = (
            work / f"{n}-{args.passages_per_doc}"
            if not args.train_run_queries
            else work / f"{n}-{args.passages_per_doc}-{args.train_run_queries}"
        )
        info = make_inputs(inputs, n, args.passages_per_doc, args.train_run_queries)
        for stage in stages:
            record = {"stage": stage, **info, **measure(stage, inputs, inputs / args.label)}
            print(json.dumps(record))
            records.append(record)
    projections = [project(records, s) for s in stages]
    payload = {"label": args.label, "machine": machine(), "records": records, "projections": projections}
    # In a folder of its own: bench/summarize.py reads every results/bench/*.json as one figure.
    out = bench_dir() / "local_stages" / f"{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    for p in projections:
        print(json.dumps(p))
        if "msmarco_mb" in p:
            write_bench(
                f"local_{p['stage']}_msmarco_mb",
                p["msmarco_mb"],
                "MB peak RSS projected to MS MARCO (line through the two largest sizes)",
                n=len(sizes),
                seconds=sum(r["seconds"] for r in records if r["stage"] == p["stage"]),
                sizes=sizes,
                label=args.label,
            )


if __name__ == "__main__":
    main()
