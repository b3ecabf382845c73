"""Stage ``bm25_index``: a Lucene index of the passages (Anserini, through pyserini's jar)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import iter_table
from dprflow.search import bm25

log = logging.getLogger("dprflow.bm25_index")


@dataclass
class Args:
    """Index passages.parquet with Lucene."""

    passages: str = field(metadata={"help": "passages.parquet"})
    index: str = field(metadata={"help": "index folder to create"})
    threads: int = field(default=1, metadata={"help": "indexing threads"})
    heap_mb: int = field(
        default=4096,
        metadata={"help": "the JVM's heap (-Xmx) in MB; Lucene buffers half of it before writing a segment"},
    )
    batch_rows: int = field(default=1 << 14, metadata={"help": "passages read and written at a time"})

    def check(self) -> None:
        if self.heap_mb < 64:
            raise ValueError(f"--heap-mb must be at least 64, got {self.heap_mb}")
        if self.batch_rows < 1:
            raise ValueError(f"--batch-rows must be at least 1, got {self.batch_rows}")


def build(args: Args) -> None:
    # Streamed: one batch of passages in Python's memory at a time (the JVM's is bounded by --heap-mb).
    passages = iter_table(
        args.passages, "passages", ["passage_id", "title", "text"], batch_rows=args.batch_rows
    )
    stats = bm25.build_index(passages, args.index, threads=args.threads, heap=f"{args.heap_mb}m")
    log.info("indexed: %s", stats)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, build, argv, "bm25_index")


if __name__ == "__main__":
    sys.exit(main())
