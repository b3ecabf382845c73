"""Stage ``evaluate``: per-query ir_measures values of one run on the evaluation split.

With ``--doc-run`` it also writes the document run it scored (``run.doc.trec``): MaxP over the
passage run, the queries of the split it scores (those with a relevant document), ranked as
trec_eval ranks. Read with the collection's
``qrels.<split>.trec`` (stage ``trec_qrels``), ir_measures, ranx and trec_eval give the
comparison's numbers (docs/interop.md).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table, write_table
from dprflow.errors import StageError
from dprflow.evaluation.metrics import (
    evaluate_run,
    judged_qrels,
    passage_run_to_doc_run,
    rank_doc_run,
)
from dprflow.search.runs import run_passages, write_trec_run

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
    doc_run: str | None = field(
        default=None,
        metadata={"help": "TREC file of the MaxP document run of the scored queries to write too"},
    )
    tag: str = field(default="dprflow-maxp", metadata={"help": "run tag of --doc-run"})
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
    qrels = read_table(args.qrels, "qrels")
    if args.doc_run:
        scored = set(judged_qrels(qrels, ids)["query_id"])
        write_trec_run(
            rank_doc_run(doc_run[doc_run["query_id"].isin(scored)]), args.doc_run, "doc_id", args.tag
        )
    per_query = evaluate_run(doc_run, qrels, ids, args.metrics)
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
