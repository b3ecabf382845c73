"""Stage ``mine_negatives``: a retriever's training-query run, top K minus positives, as a negative pool."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table, write_table
from dprflow.search.runs import negatives_from_run, positive_passages

log = logging.getLogger("dprflow.mine_negatives")


@dataclass
class Args:
    """Mine hard negatives from a run (K2 after retriever 1, K3 after retriever 2)."""

    run: str = field(metadata={"help": "run.parquet of the training queries"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    out: str = field(metadata={"help": "negatives.parquet to write"})
    depth: int = field(default=200, metadata={"help": "pool depth"})


def mine(args: Args) -> None:
    run = read_table(args.run, "run")
    positives = positive_passages(read_table(args.qrels, "qrels"), read_table(args.passages, "passages"))
    write_table(negatives_from_run(run, positives, args.depth), args.out, "negatives")


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, mine, argv, "mine_negatives")


if __name__ == "__main__":
    sys.exit(main())
