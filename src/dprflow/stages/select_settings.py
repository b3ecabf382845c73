"""Stage ``select_settings``: the grid point and the fusion weight chosen on held-out queries.

Reads every grid point's per-query metrics on the held-out training queries (stage ``evaluate``
on ``heldout_queries``' split ``heldout``), takes the point with the highest mean of the named
metric (:func:`dprflow.finetuning.selection.best_point`), then fuses that point's held-out run
with BM25's at each weight of the fusion grid and keeps the best weight. Writes
``selection.json``: every point's and every weight's held-out value, the winners and the margins,
which the rows' training (``--selection``), the fused rows and the comparison read
(docs/selection.md). The held-out runs are at most ``finetune.select.max_queries`` queries: they
are read whole.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field

import pandas as pd

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.errors import StageError
from dprflow.evaluation.metrics import evaluate_run, judged_qrels, passage_run_to_doc_run
from dprflow.files import atomic_path
from dprflow.finetuning.selection import FUSION_METHODS, HELDOUT, best_point, fuse_runs, point_name
from dprflow.search.runs import run_passages

log = logging.getLogger("dprflow.select_settings")


@dataclass
class Args:
    """Choose the fine-tuning settings and the fusion weight on held-out training queries."""

    grid: str = field(metadata={"help": "the grid points' settings: a JSON list of objects, in grid order"})
    metrics: list[str] = field(metadata={"help": "each point's held-out metrics.parquet, in grid order"})
    runs: list[str] = field(metadata={"help": "each point's held-out run.parquet, in grid order"})
    metric: str = field(metadata={"help": "the ir_measures name the choice maximises"})
    out: str = field(metadata={"help": "selection.json to write"})
    bm25_run: str | None = field(default=None, metadata={"help": "BM25's held-out run.parquet (fusion)"})
    queries: str | None = field(default=None, metadata={"help": "heldout_queries' queries.parquet (fusion)"})
    qrels: str | None = field(default=None, metadata={"help": "qrels.parquet (fusion)"})
    passages: str | None = field(default=None, metadata={"help": "passages.parquet (fusion)"})
    fusion_method: str = field(
        default="convex", metadata={"help": "convex or rrf", "choices": list(FUSION_METHODS)}
    )
    weights: list[float] = field(default_factory=list, metadata={"help": "dense weights to try (convex)"})
    rrf_k: int = field(default=60, metadata={"help": "RRF's k"})
    depth: int = field(default=1000, metadata={"help": "depth of the fused runs"})

    def check(self) -> None:
        if not (len(self.metrics) == len(self.runs) == len(json.loads(self.grid))):
            raise ValueError("--grid, --metrics and --runs must name the same points, in the same order")
        if any(not 0 <= w <= 1 for w in self.weights):
            raise ValueError(f"--weights must lie in [0, 1], got {self.weights}")
        if self.bm25_run and not (self.queries and self.qrels and self.passages):
            raise ValueError("--bm25-run needs --queries, --qrels and --passages")


def mean_metric(path: str, metric: str) -> float:
    table = read_table(path, "metrics")
    values = table.loc[table["metric"] == metric, "value"]
    if values.empty:
        raise StageError(f"{path}: no value of metric {metric!r}; metrics: {sorted(set(table['metric']))}")
    return float(values.mean())


def heldout_value(
    run: pd.DataFrame, parents: pd.DataFrame, qrels: pd.DataFrame, ids: list[str], metric: str
) -> float:
    """The mean of ``metric`` of a held-out passage run, scored as stage ``evaluate`` scores (MaxP);
    ``parents`` (passage_id, doc_id) covers every passage the run names."""
    doc_run = passage_run_to_doc_run(run, parents)
    values = evaluate_run(doc_run, qrels, ids, [metric])
    return float(values["value"].mean())


def select(args: Args) -> dict:
    grid = json.loads(args.grid)
    values = {point_name(s): mean_metric(m, args.metric) for s, m in zip(grid, args.metrics, strict=True)}
    best = best_point(values)
    settings = grid[list(values).index(best)]
    ranked = sorted(values.values(), reverse=True)
    selection = {
        "metric": args.metric,
        "retriever": {
            "points": [
                {"point": n, "settings": s, "value": v}
                for (n, v), s in zip(values.items(), grid, strict=True)
            ],
            "best": best,
            "settings": settings,
            "margin": ranked[0] - ranked[1] if len(ranked) > 1 else None,
        },
    }
    log.info("held-out %s: %s; best %s", args.metric, values, best)
    if args.bm25_run:
        selection["fusion"] = choose_fusion(args, args.runs[list(values).index(best)])
    with atomic_path(args.out) as tmp, open(tmp, "w") as fh:
        json.dump(selection, fh, indent=2)
    return {"best": best, "value": values[best]}


def choose_fusion(args: Args, dense_path: str) -> dict:
    queries = read_table(args.queries, "queries")
    ids = queries.loc[queries["split"] == HELDOUT, "query_id"].tolist()
    qrels = judged_qrels(read_table(args.qrels, "qrels"), ids)
    dense, bm25 = read_table(dense_path, "run"), read_table(args.bm25_run, "run")
    if set(dense["query_id"]) - set(ids) or set(bm25["query_id"]) - set(ids):
        raise StageError(f"{dense_path} or {args.bm25_run}: a query that is not held out in {args.queries}")
    # a fused run names passages of these two only: the passages table is read once, not per weight
    parents = run_passages(args.passages, pd.concat([dense["passage_id"], bm25["passage_id"]]))
    alone = {
        "dense": heldout_value(dense, parents, qrels, ids, args.metric),
        "bm25": heldout_value(bm25, parents, qrels, ids, args.metric),
    }
    weights = args.weights if args.fusion_method == "convex" else [None]
    values = {}
    for weight in weights:
        fused = fuse_runs(dense, bm25, args.fusion_method, weight or 0.0, args.rrf_k, args.depth)
        values[weight] = heldout_value(fused, parents, qrels, ids, args.metric)
    best = best_point(values)
    log.info(
        "held-out %s of the fused run: %s (dense alone %.4f, BM25 alone %.4f)",
        args.metric,
        values,
        alone["dense"],
        alone["bm25"],
    )
    return {
        "method": args.fusion_method,
        "rrf_k": args.rrf_k,
        "weights": [{"weight": w, "value": v} for w, v in values.items()],
        "weight": best,
        "value": values[best],
        "alone": alone,
    }


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, select, argv, "select_settings")


if __name__ == "__main__":
    sys.exit(main())
