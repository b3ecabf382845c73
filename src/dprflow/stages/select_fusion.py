"""Stage ``select_fusion``: a fused row's dense weight chosen on held-out training queries.

The dense run is the model off the shelf's held-out run (for ``zeroshot+bm25``), or that of the
grid point stage ``select_settings`` chose (retriever 1 trained on the fit part, for a fine-tuned
row's fusion; with no grid, the one point). It is fused with BM25's held-out run under each
normalisation of ``finetune.fusion.normalizations`` at each weight of ``finetune.fusion.weights``
(:mod:`dprflow.search.fusion`, each run normalised once; the dense score's bound from the ``encoder.json``
beside the run), each fused run scored as stage ``evaluate`` scores (MaxP), and the pair with the
highest mean of the named metric kept (:func:`dprflow.finetuning.selection.best_point`; a tie
goes to the first, normalisations in their listed order). Writes ``fusion.json``: every pair's
held-out value, the chosen pair, and the two runs' values alone, which stage ``fuse`` and the
comparison read (docs/selection.md). A job of its own, apart
from ``select_settings``: a change to the fusion reruns this job and the fused rows, and retrains
no retriever. The held-out runs are at most ``finetune.select.max_queries`` queries: they are
read whole.
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
from dprflow.finetuning.selection import HELDOUT, best_point, chosen_path
from dprflow.search.fusion import NORMALIZATIONS, combine, dense_lower_bound, normalised_runs, read_encoder
from dprflow.search.runs import run_passages

log = logging.getLogger("dprflow.select_fusion")


@dataclass
class Args:
    """Choose a fused row's dense weight on held-out training queries."""

    runs: list[str] = field(metadata={"help": "the dense held-out run.parquet: one, or each grid point's"})
    bm25_run: str = field(metadata={"help": "BM25's held-out run.parquet"})
    queries: str = field(metadata={"help": "heldout_queries' queries.parquet"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    metric: str = field(metadata={"help": "the ir_measures name the choice maximises"})
    out: str = field(metadata={"help": "fusion.json to write"})
    selection: str | None = field(
        default=None,
        metadata={"help": "select_settings' selection.json: whose of --runs is the chosen point's"},
    )
    method: str = field(
        default="convex", metadata={"help": "convex (rrf chooses nothing)", "choices": ["convex"]}
    )
    weights: list[float] = field(default_factory=list, metadata={"help": "dense weights to try"})
    normalizations: list[str] = field(
        default_factory=lambda: ["minmax"],
        metadata={"help": "per-query normalisations to try (theoretical, minmax)"},
    )
    rrf_k: int = field(default=60, metadata={"help": "RRF's k (recorded)"})
    depth: int = field(default=1000, metadata={"help": "depth of the fused runs"})

    def check(self) -> None:
        if not self.weights:
            raise ValueError("--weights: no weight to try")
        if any(not 0 <= w <= 1 for w in self.weights):
            raise ValueError(f"--weights must lie in [0, 1], got {self.weights}")
        unknown = sorted(set(self.normalizations) - set(NORMALIZATIONS))
        if unknown or not self.normalizations:
            raise ValueError(f"--normalizations: {unknown or 'none'}; allowed: {', '.join(NORMALIZATIONS)}")
        if len(self.runs) > 1 and not self.selection:
            raise ValueError("--runs names several grid points: --selection says which was chosen")


def heldout_value(
    run: pd.DataFrame, parents: pd.DataFrame, qrels: pd.DataFrame, ids: list[str], metric: str
) -> float:
    """The mean of ``metric`` of a held-out passage run, scored as stage ``evaluate`` scores (MaxP);
    ``parents`` (passage_id, doc_id) covers every passage the run names."""
    doc_run = passage_run_to_doc_run(run, parents)
    values = evaluate_run(doc_run, qrels, ids, [metric])
    return float(values["value"].mean())


def choose(args: Args) -> dict:
    dense_path = chosen_path(args.runs, args.selection)
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
    lower = dense_lower_bound(read_encoder(dense_path))
    values = {}
    for normalization in args.normalizations:
        normalised = normalised_runs(dense, bm25, normalization, lower)  # once, not per weight
        for weight in args.weights:
            fused = combine(normalised, weight, args.depth)
            values[(normalization, weight)] = heldout_value(fused, parents, qrels, ids, args.metric)
    best = best_point(values)
    log.info(
        "held-out %s of %s fused with BM25: %s (dense alone %.4f, BM25 alone %.4f)",
        args.metric,
        dense_path,
        values,
        alone["dense"],
        alone["bm25"],
    )
    fusion = {
        "metric": args.metric,
        "dense_run": dense_path,
        "dense_lower_bound": lower,
        "method": args.method,
        "rrf_k": args.rrf_k,
        "weights": [{"normalization": n, "weight": w, "value": v} for (n, w), v in values.items()],
        "normalization": best[0],
        "weight": best[1],
        "value": values[best],
        "alone": alone,
    }
    with atomic_path(args.out) as tmp, open(tmp, "w") as fh:
        json.dump(fusion, fh, indent=2)
    return {"normalization": best[0], "weight": best[1], "value": values[best]}


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, choose, argv, "select_fusion")


if __name__ == "__main__":
    sys.exit(main())
