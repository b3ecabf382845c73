"""Stage ``bm25_negatives``: each training query's BM25 top K1 minus its positives."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.search import bm25
from dprflow.search.bm25_stages import LuceneArgs, split_queries
from dprflow.search.runs import read_positive_passages, write_negatives

log = logging.getLogger("dprflow.bm25_negatives")


@dataclass
class Args(LuceneArgs):
    """Write bm25_negatives.parquet for the retriever-1 stage."""

    index: str = field(metadata={"help": "the Lucene index folder"})
    queries: str = field(metadata={"help": "queries.parquet"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    split: str = field(metadata={"help": "the training split"})
    out: str = field(metadata={"help": "negatives.parquet to write"})
    depth: int = field(default=1000, metadata={"help": "K1: depth of the pool"})


def negatives(args: Args) -> None:
    # Streamed by Java call (a batch of queries in query_id order): one batch of the run in memory.
    queries = split_queries(args.queries, args.split)
    pieces = bm25.iter_search(
        args.index,
        queries[["query_id", "text"]],
        k=args.depth,
        k1=args.k1,
        b=args.b,
        threads=args.threads,
        heap=f"{args.heap_mb}m",
        batch_size=max(1, args.hits_per_call // args.depth),
    )
    positives = read_positive_passages(args.qrels, args.passages)
    counts = write_negatives(pieces, positives, args.depth, args.out)
    log.info(
        "%d training queries, %d with an empty negative pool", len(queries), len(queries) - counts["queries"]
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, negatives, argv, "bm25_negatives")


if __name__ == "__main__":
    sys.exit(main())
