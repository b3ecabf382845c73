"""Stage ``bm25_search``: a BM25 run of the evaluation queries (Parquet and TREC)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.search import bm25
from dprflow.search.bm25_stages import LuceneArgs, split_queries
from dprflow.search.runs import write_run_pieces

log = logging.getLogger("dprflow.bm25_search")


@dataclass
class Args(LuceneArgs):
    """Search the Lucene index with one split's queries."""

    index: str = field(metadata={"help": "the Lucene index folder"})
    queries: str = field(metadata={"help": "queries.parquet"})
    split: str = field(metadata={"help": "query split to search"})
    out: str = field(metadata={"help": "run.parquet to write"})
    trec: str | None = field(default=None, metadata={"help": "TREC run file to write too"})
    k: int = field(default=1000, metadata={"help": "hits per query"})


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
