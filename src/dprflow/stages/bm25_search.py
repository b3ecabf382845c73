"""Stage ``bm25_search``: a BM25 run of the evaluation queries (Parquet and TREC)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.errors import StageError
from dprflow.search import bm25
from dprflow.search.runs import write_run_pieces

log = logging.getLogger("dprflow.bm25_search")


@dataclass(kw_only=True)
class LuceneArgs:
    """The BM25 settings and the Java-call size both Lucene search stages take."""

    k1: float = field(default=0.9, metadata={"help": "BM25 k1"})
    b: float = field(default=0.4, metadata={"help": "BM25 b"})
    threads: int = field(default=1, metadata={"help": "search threads"})
    hits_per_call: int = field(
        default=500_000,
        metadata={
            "help": "hits per Java call (queries per call: this over the depth): one call's hits are "
            "held at a time, so this bounds the memory of the JVM and of Python"
        },
    )
    heap_mb: int = field(
        default=4096,
        metadata={
            "help": "the JVM's heap (-Xmx) in MB: one call's hits must fit in it (2M hits ran in 1024)"
        },
    )

    def check(self) -> None:
        if self.hits_per_call < 1:
            raise ValueError(f"--hits-per-call must be at least 1, got {self.hits_per_call}")
        if self.heap_mb < 64:
            raise ValueError(f"--heap-mb must be at least 64, got {self.heap_mb}")


@dataclass
class Args(LuceneArgs):
    """Search the Lucene index with one split's queries."""

    index: str = field(metadata={"help": "the Lucene index folder"})
    queries: str = field(metadata={"help": "queries.parquet"})
    split: str = field(metadata={"help": "query split to search"})
    out: str = field(metadata={"help": "run.parquet to write"})
    trec: str | None = field(default=None, metadata={"help": "TREC run file to write too"})
    k: int = field(default=1000, metadata={"help": "hits per query"})


def split_queries(path: str, split: str):
    queries = read_table(path, "queries")
    chosen = queries[queries["split"] == split]
    if chosen.empty:
        raise StageError(f"{path}: no query of split {split!r}; splits: {sorted(set(queries['split']))}")
    return chosen


def search(args: Args) -> None:
    # Streamed by Java call (a batch of queries in query_id order): one batch of the run in memory.
    queries = split_queries(args.queries, args.split)
    pieces = bm25.iter_search(
        args.index,
        queries[["query_id", "text"]],
        k=args.k,
        k1=args.k1,
        b=args.b,
        threads=args.threads,
        heap=f"{args.heap_mb}m",
        batch_size=max(1, args.hits_per_call // args.k),
    )
    counts = write_run_pieces(pieces, args.out, args.trec, tag="bm25")
    log.info(
        "%d queries of split %s, %d answered, %d hits",
        len(queries),
        args.split,
        counts["queries"],
        counts["rows"],
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, search, argv, "bm25_search")


if __name__ == "__main__":
    sys.exit(main())
