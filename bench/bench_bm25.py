"""Lucene BM25 throughput through Anserini: documents indexed per second and queries per second.

Usage::

    python bench/bench_bm25.py                              # a corpus of stdlib docstrings, standalone
    python bench/bench_bm25.py --passages work/passages.parquet [--queries work/queries.parquet]

Without ``--passages`` the corpus is built from the docstrings of Python's standard library
(passages), and their first lines are the queries (each has one obviously right answer, which is
reported as a sanity figure). With ``--passages`` but no ``--queries``, the first words of a sample
of passages are the queries.

Every ``build_index`` or ``search`` call starts a JVM (and Anserini) first, which takes one to a
few seconds whatever the input size. The script measures that start-up with a one-passage index
and a one-query search, and reports in ``value`` the throughput *excluding* it (which is what
extrapolates to large collections); ``value_incl_jvm_start`` is the end-to-end figure.
Writes ``results/bench/bm25_index.json`` and ``results/bench/bm25_search.json``.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pandas as pd
from _common import write_bench

from dprflow.search import bm25


def stdlib_docstrings(max_docs: int, min_words: int = 8) -> pd.DataFrame:
    """Passages (``passage_id``, ``title``, ``text``) from the docstrings of stdlib modules, classes and functions."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
    for path in sorted(stdlib.rglob("*.py")):
        if skip.intersection(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        module = ".".join(path.relative_to(stdlib).with_suffix("").parts)
        nodes = [tree] + [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        for node in nodes:
            doc = ast.get_docstring(node)
            if not doc or len(doc.split()) < min_words or doc in seen:
                continue
            seen.add(doc)
            rows.append((module if node is tree else f"{module}.{node.name}", doc))
            if len(rows) >= max_docs:
                break
        if len(rows) >= max_docs:
            break
    return pd.DataFrame(
        {
            "passage_id": [f"py{i}" for i in range(len(rows))],
            "title": [t for t, _ in rows],
            "text": [d for _, d in rows],
        }
    )


def first_line_queries(passages: pd.DataFrame, max_queries: int, max_words: int = 12) -> pd.DataFrame:
    """One query per passage: the first ``max_words`` words of its text's first non-empty line."""
    sample = (
        passages.sample(n=min(max_queries, len(passages)), random_state=0)
        if len(passages) > max_queries
        else passages
    )
    texts = [next((ln for ln in t.splitlines() if ln.strip()), "") for t in sample["text"].astype(str)]
    texts = [" ".join(t.split()[:max_words]) for t in texts]
    return pd.DataFrame({"query_id": [f"q-{p}" for p in sample["passage_id"]], "text": texts})


def rate(n: int, seconds: float, startup: float) -> tuple[float, str]:
    """(value, what it is): n per second excluding JVM start-up, unless the work is too short to tell apart."""
    net = seconds - startup
    if net < 0.1 * seconds:
        return n / seconds, (
            "including JVM start-up: the work took too little time to separate from start-up (use a larger input)"
        )
    return n / net, "excluding JVM start-up (seconds - jvm_start_seconds); value_incl_jvm_start includes it"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=Path, help="a passages parquet table (default: stdlib docstrings)")
    parser.add_argument(
        "--queries", type=Path, help="a queries parquet table (default: first lines of passages)"
    )
    parser.add_argument("--max-docs", type=int, default=5000, help="docstrings to use without --passages")
    parser.add_argument("--max-queries", type=int, default=5000, help="queries to derive without --queries")
    parser.add_argument("--k", type=int, default=100, help="hits per query")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="Java threads")
    parser.add_argument("--heap", default="4g", help="JVM heap (-Xmx)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.passages:
        from dprflow.data.schemas import read_table

        passages = read_table(args.passages, "passages")
        source = str(args.passages)
    else:
        passages = stdlib_docstrings(args.max_docs)
        source = f"stdlib docstrings of Python {sys.version.split()[0]}"
    if args.queries:
        from dprflow.data.schemas import read_table

        queries = read_table(args.queries, "queries")[["query_id", "text"]]
    else:
        queries = first_line_queries(passages, args.max_queries)
    print(f"{len(passages)} passages, {len(queries)} queries from {source}; java {bm25.find_java()}")

    with tempfile.TemporaryDirectory(prefix="bench-bm25-") as tmp:
        tmp = Path(tmp)
        # JVM + Anserini start-up: the same calls on one passage and one query.
        t0 = time.perf_counter()
        bm25.build_index(passages.head(1), tmp / "tiny", threads=1, heap=args.heap)
        startup_index = time.perf_counter() - t0
        t0 = time.perf_counter()
        bm25.search(tmp / "tiny", queries.head(1), k=args.k, threads=1, heap=args.heap)
        startup_search = time.perf_counter() - t0

        t0 = time.perf_counter()
        stats = bm25.build_index(passages, tmp / "index", threads=args.threads, heap=args.heap)
        index_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        run = bm25.search(tmp / "index", queries, k=args.k, threads=args.threads, heap=args.heap)
        search_seconds = time.perf_counter() - t0

    common = {
        "threads": args.threads,
        "heap": args.heap,
        "source": source,
        "java": bm25.find_java(),
        "jar": bm25.anserini_jar().name,
        "load_average": [round(x, 2) for x in os.getloadavg()],  # other processes skew the figures
    }
    n_docs = stats["n_docs"]
    value, value_is = rate(n_docs, index_seconds, startup_index)
    write_bench(
        "bm25_index",
        value,
        "docs/s",
        value_is=value_is,
        n=n_docs,
        seconds=index_seconds,
        jvm_start_seconds=startup_index,
        value_incl_jvm_start=n_docs / index_seconds,
        **common,
    )
    extra = {}
    if not args.queries:  # each query is the first line of one passage: how often is that passage retrieved?
        own = run[run["query_id"] == "q-" + run["passage_id"]]
        extra = {
            "own_passage_at_1": float((own["rank"] == 1).sum() / len(queries)),
            f"own_passage_at_{args.k}": float(len(own) / len(queries)),
        }
    n_queries = len(queries)
    value, value_is = rate(n_queries, search_seconds, startup_search)
    write_bench(
        "bm25_search",
        value,
        "queries/s",
        value_is=value_is,
        n=n_queries,
        seconds=search_seconds,
        jvm_start_seconds=startup_search,
        value_incl_jvm_start=n_queries / search_seconds,
        k=args.k,
        n_hits=len(run),
        n_docs=n_docs,
        **extra,
        **common,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
