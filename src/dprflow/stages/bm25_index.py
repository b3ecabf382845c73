"""Stage ``bm25_index``: a Lucene index of the passages (Anserini, through pyserini's jar)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.search import bm25

log = logging.getLogger("dprflow.bm25_index")


@dataclass
class Args:
    """Index passages.parquet with Lucene."""

    passages: str = field(metadata={"help": "passages.parquet"})
    index: str = field(metadata={"help": "index folder to create"})
    threads: int = field(default=1, metadata={"help": "indexing threads"})


def build(args: Args) -> None:
    passages = read_table(args.passages, "passages")
    stats = bm25.build_index(passages, args.index, threads=args.threads)
    log.info("indexed: %s", stats)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, build, argv, "bm25_index")


if __name__ == "__main__":
    sys.exit(main())
