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
from contextlib import ExitStack
from dataclasses import dataclass, field

import pandas as pd

from dprflow.cli import run_stage
from dprflow.data.ids import id_set, in_set
from dprflow.data.schemas import iter_query_groups, iter_table, read_table, write_table
from dprflow.errors import StageError
from dprflow.evaluation.metrics import evaluate_pieces, judged_qrels, max_p, rank_doc_run
from dprflow.search.runs import RunParents, sorted_trec_run

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


# Rows of the run a piece: about 260 queries at MS MARCO's depth of 1,000.
RUN_BATCH_ROWS = 1 << 18


def evaluate(args: Args) -> None:
    # Streamed by whole queries: one piece of the run in memory, its passages' documents held as
    # Arrow strings, the queries and qrels of the split only (bench/RESULTS.md, "The local stages").
    ids = split_query_ids(args.queries, args.split)
    qrels = split_qrels(args.qrels, ids)
    scored = set(judged_qrels(qrels, ids)["query_id"])
    if not scored:
        raise StageError(f"{args.qrels}: no query of split {args.split!r} has a relevant judgment")
    parents = RunParents(args.run, args.passages)
    log.info("%s names %d distinct passages", args.run, len(parents))
    with ExitStack() as stack:
        trec = (
            stack.enter_context(sorted_trec_run(args.doc_run, "doc_id", args.tag)) if args.doc_run else None
        )

        def doc_runs():
            for piece in iter_query_groups(args.run, "run", batch_rows=RUN_BATCH_ROWS):
                doc_run = max_p(piece, parents.of(piece["passage_id"]))
                if trec is not None:
                    trec.write(rank_doc_run(doc_run[doc_run["query_id"].isin(scored)]))
                yield doc_run

        per_query = evaluate_pieces(doc_runs(), qrels, ids, args.metrics)
    write_table(per_query, args.out, "metrics")
    means = per_query.groupby("metric", sort=False)["value"].mean()
    log.info(
        "%s on %d queries: %s",
        args.run,
        per_query["query_id"].nunique(),
        ", ".join(f"{m} {v:.4f}" for m, v in means.items()),
    )


def split_query_ids(path: str, split: str) -> list[str]:
    """The ids of the queries of ``split``, in the table's order, read without their text."""
    ids, splits = [], set()
    for piece in iter_table(path, "queries", ["query_id", "split"], batch_rows=1 << 18):
        ids += piece.loc[piece["split"] == split, "query_id"].tolist()
        splits.update(piece["split"].unique())
    if not ids:
        raise StageError(f"{path}: no query of split {split!r}; splits: {sorted(splits)}")
    return ids


def split_qrels(path: str, query_ids: list[str]) -> pd.DataFrame:
    """The judgments of ``query_ids``, in the table's order, read piece by piece (the other
    splits' judgments, MS MARCO's 532k training ones, are never held)."""
    wanted = id_set(query_ids)
    parts = [
        piece[in_set(piece["query_id"], wanted)] for piece in iter_table(path, "qrels", batch_rows=1 << 18)
    ]
    return pd.concat(parts, ignore_index=True) if parts else read_table(path, "qrels")


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, evaluate, argv, "evaluate")


if __name__ == "__main__":
    sys.exit(main())
