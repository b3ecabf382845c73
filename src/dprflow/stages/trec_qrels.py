"""Stage ``trec_qrels``: a collection's judgments of one query split as a TREC qrels file.

Writes ``qrels.<split>.trec`` (``query_id 0 doc_id relevance``) with the queries the comparison
scores: those of the split with at least one relevant document. With a row's ``run.doc.trec``,
trec_eval, ir_measures and ranx give the comparison's numbers (docs/interop.md).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.errors import StageError
from dprflow.evaluation.metrics import judged_qrels
from dprflow.search.runs import write_trec_qrels

log = logging.getLogger("dprflow.trec_qrels")


@dataclass
class Args:
    """Write the judged queries' qrels of one split as a TREC qrels file."""

    queries: str = field(metadata={"help": "queries.parquet"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    split: str = field(metadata={"help": "the query split"})
    out: str = field(metadata={"help": "qrels.<split>.trec to write"})


def export(args: Args) -> None:
    queries = read_table(args.queries, "queries")
    ids = queries.loc[queries["split"] == args.split, "query_id"].tolist()
    qrels = judged_qrels(read_table(args.qrels, "qrels"), ids)
    if qrels.empty:
        raise StageError(f"{args.qrels}: no query of split {args.split!r} has a relevant judgment")
    write_trec_qrels(qrels.sort_values(["query_id", "doc_id"], kind="stable"), args.out)
    log.info(
        "%d judgments of %d queries (split %s) in %s",
        len(qrels),
        qrels["query_id"].nunique(),
        args.split,
        args.out,
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, export, argv, "trec_qrels")


if __name__ == "__main__":
    sys.exit(main())
