"""Stage ``mine_negatives``: a retriever's training-query run, top K minus positives, as a negative pool.

For the negatives' grid of the selection (docs/selection.md) the run is the fit queries' run of the
retriever-1 grid point chosen on held-out queries: every point's run is given with the
selection.json that names the winner."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import iter_query_groups
from dprflow.finetuning.selection import chosen_path
from dprflow.search.runs import read_positive_passages, write_negatives

log = logging.getLogger("dprflow.mine_negatives")


@dataclass
class Args:
    """Mine hard negatives from a run (K2 after retriever 1, K3 after retriever 2)."""

    run: list[str] = field(
        metadata={
            "help": "run.parquet of the training queries: one, or each retriever grid point's (--selection)"
        }
    )
    qrels: str = field(metadata={"help": "qrels.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    out: str = field(metadata={"help": "negatives.parquet to write"})
    depth: int = field(default=200, metadata={"help": "pool depth"})
    selection: str | None = field(
        default=None,
        metadata={"help": "select_settings' selection.json: whose of --run is the chosen retriever point's"},
    )


def mine(args: Args) -> None:
    # Streamed by whole queries: one batch of the run in memory, the passages' text never read.
    run = chosen_path(args.run, args.selection)
    log.info("mining %s", run)
    positives = read_positive_passages(args.qrels, args.passages)
    write_negatives(iter_query_groups(run, "run"), positives, args.depth, args.out)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, mine, argv, "mine_negatives")


if __name__ == "__main__":
    sys.exit(main())
