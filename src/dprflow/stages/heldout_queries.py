"""Stage ``heldout_queries``: the training queries split into a fit part and a held-out part.

Writes a queries table holding the training split's queries only, relabelled ``fit`` or
``heldout`` (:func:`dprflow.finetuning.selection.heldout_ids`, over the queries with a relevant
judgment; a query without one stays in ``fit``, where training skips it): the selection's jobs
read this table, so none of them can read a test query (docs/selection.md).

A choice made on fewer than ``min_queries`` held-out queries is refused (``finetune.select.min_queries``,
30 by default): CISI's 10 held-out queries chose a learning rate by 0.0001 nDCG@10 and fusion
weights that put every fused row below its own dense row on the test queries (docs/selection.md).
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table, write_table
from dprflow.errors import StageError
from dprflow.evaluation.metrics import judged_qrels
from dprflow.finetuning.selection import FIT, HELDOUT, heldout_ids

log = logging.getLogger("dprflow.heldout_queries")


@dataclass
class Args:
    """Split the training queries into fit and held-out parts."""

    queries: str = field(metadata={"help": "queries.parquet of the collection"})
    qrels: str = field(metadata={"help": "qrels.parquet of the collection"})
    split: str = field(metadata={"help": "the training split to divide"})
    out: str = field(metadata={"help": "queries.parquet to write (splits fit and heldout)"})
    fraction: float = field(default=0.2, metadata={"help": "share of the judged training queries held out"})
    max_queries: int = field(default=2000, metadata={"help": "at most this many held out"})
    min_queries: int = field(
        default=30, metadata={"help": "refuse to choose on fewer held-out queries than this"}
    )
    seed: int = field(default=13, metadata={"help": "seed of the split"})

    def check(self) -> None:
        if not 0 < self.fraction < 1:
            raise ValueError(f"--fraction must be in (0, 1), got {self.fraction}")
        if self.max_queries < 1:
            raise ValueError(f"--max-queries must be >= 1, got {self.max_queries}")
        if not 1 <= self.min_queries <= self.max_queries:
            raise ValueError(
                f"--min-queries must be in [1, --max-queries {self.max_queries}], got {self.min_queries}"
            )


def too_few(n_judged: int, n_held: int, args: Args) -> str | None:
    """Why ``n_held`` held-out queries of ``n_judged`` are too few to choose on, and what to change,
    or None when they are enough."""
    if n_held >= args.min_queries:
        return None
    what = (
        f"{n_judged} judged training queries of split {args.split!r} give {n_held} held out "
        f"(finetune.select.fraction {args.fraction:g}), fewer than finetune.select.min_queries "
        f"{args.min_queries}: a choice on so few queries is noise"
    )
    if n_judged - 1 >= args.min_queries:
        need = math.ceil(1000 * args.min_queries / n_judged) / 1000  # holds out min_queries or more
        return f"{what}; raise finetune.select.fraction to {need:g} or more, or lower min_queries"
    return (
        f"{what}, and the collection has too few to hold out {args.min_queries}: lower "
        "finetune.select.min_queries, or choose nothing (finetune.select.retriever: {} and no "
        "finetune.fusion.rows; the rows then train with finetune.retriever as configured)"
    )


def split(args: Args) -> dict[str, int]:
    queries = read_table(args.queries, "queries")
    training = queries[queries["split"] == args.split].copy()
    if training.empty:
        raise StageError(
            f"{args.queries}: no query of split {args.split!r}; splits: {sorted(set(queries['split']))}"
        )
    judged = judged_qrels(read_table(args.qrels, "qrels"), training["query_id"].tolist())
    held = heldout_ids(judged["query_id"], args.fraction, args.max_queries, args.seed)
    problem = too_few(judged["query_id"].nunique(), len(held), args)
    if problem:
        raise StageError(f"{args.qrels}: {problem}")
    training["split"] = [HELDOUT if q in held else FIT for q in training["query_id"]]
    write_table(training.reset_index(drop=True), args.out, "queries")
    counts = {"fit": int((training["split"] == FIT).sum()), "heldout": len(held)}
    log.info(
        "split %s of %s: %d fit, %d held out (seed %d)",
        args.split,
        args.queries,
        counts["fit"],
        len(held),
        args.seed,
    )
    return counts


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, split, argv, "heldout_queries")


if __name__ == "__main__":
    sys.exit(main())
