"""Stage ``evaluate``: per-query ir_measures values of one run on the evaluation split."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import StageError, run_stage
from dprflow.data.schemas import read_table, write_table
from dprflow.evaluation.metrics import evaluate_run, passage_run_to_doc_run
from dprflow.search.runs import run_passages

log = logging.getLogger("dprflow.evaluate")


@dataclass
class Args:
    """Score a passage run against document qrels (MaxP)."""

    run: str = field(metadata={"help": "run.parquet"})
    passages: str = field(metadata={"help": "passages.parquet (passage -> document)"})
    queries: str = field(metadata={"help": "queries.parquet"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    split: str = field(metadata={"help": "the query split to score"})
    out: str = field(metadata={"help": "metrics.parquet to write"})
    metrics: list[str] = field(
        default_factory=lambda: ["RR@10", "R@50", "R@100", "R@1000", "nDCG@10"],
        metadata={"help": "ir_measures names"},
    )


def evaluate(args: Args) -> None:
    queries = read_table(args.queries, "queries")
    ids = queries.loc[queries["split"] == args.split, "query_id"].tolist()
    if not ids:
        raise StageError(
            f"{args.queries}: no query of split {args.split!r}; splits: {sorted(set(queries['split']))}"
        )
    run = read_table(args.run, "run")
    # Of the passages only the ids of those the run names: memory follows the run, not the corpus.
    doc_run = passage_run_to_doc_run(run, run_passages(args.passages, run["passage_id"]))
    per_query = evaluate_run(doc_run, read_table(args.qrels, "qrels"), ids, args.metrics)
    if per_query.empty:
        raise StageError(f"{args.qrels}: no query of split {args.split!r} has a relevant judgment")
    write_table(per_query, args.out, "metrics")
    means = per_query.groupby("metric", sort=False)["value"].mean()
    log.info(
        "%s on %d queries: %s",
        args.run,
        per_query["query_id"].nunique(),
        ", ".join(f"{m} {v:.4f}" for m, v in means.items()),
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, evaluate, argv, "evaluate")


if __name__ == "__main__":
    sys.exit(main())
