"""Stage ``bm25_negatives``: each training query's BM25 top K1 minus its positives."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table, write_table
from dprflow.search import bm25
from dprflow.search.runs import negatives_from_run, positive_passages
from dprflow.stages.bm25_search import split_queries

log = logging.getLogger("dprflow.bm25_negatives")


@dataclass
class Args:
    """Write bm25_negatives.parquet for the retriever-1 stage."""

    index: str = field(metadata={"help": "the Lucene index folder"})
    queries: str = field(metadata={"help": "queries.parquet"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    split: str = field(metadata={"help": "the training split"})
    out: str = field(metadata={"help": "negatives.parquet to write"})
    depth: int = field(default=1000, metadata={"help": "K1: depth of the pool"})
    k1: float = field(default=0.9, metadata={"help": "BM25 k1"})
    b: float = field(default=0.4, metadata={"help": "BM25 b"})
    threads: int = field(default=1, metadata={"help": "search threads"})


def negatives(args: Args) -> None:
    queries = split_queries(args.queries, args.split)
    run = bm25.search(
        args.index, queries[["query_id", "text"]], k=args.depth, k1=args.k1, b=args.b, threads=args.threads
    )
    positives = positive_passages(read_table(args.qrels, "qrels"), read_table(args.passages, "passages"))
    pool = negatives_from_run(run, positives, args.depth)
    write_table(pool, args.out, "negatives")
    empty = len(set(queries["query_id"]) - set(pool["query_id"]))
    log.info("%d training queries, %d with an empty negative pool", len(queries), empty)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, negatives, argv, "bm25_negatives")


if __name__ == "__main__":
    sys.exit(main())
