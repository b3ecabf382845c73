"""Stage ``select_settings``: the grid point chosen on held-out queries.

Reads every grid point's per-query metrics on the held-out training queries (stage ``evaluate``
on ``heldout_queries``' split ``heldout``) and takes the point with the highest mean of the named
metric (:func:`dprflow.finetuning.selection.best_point`). Writes ``selection.json``: every
point's held-out value, the winner and its margin under the grid's section (``retriever`` or
``reranker``; a reranker's grid also records its first stage's held-out value, the run it
reranked, so that the comparison shows whether reranking helped at all), which the rows' training
(``--selection``),
the fusion weight's choice (stage ``select_fusion``) and the comparison read
(docs/selection.md). The fusion weight is chosen in a job of its own, so that a change to the
fusion retrains no retriever. A winner at an edge of its grid (the largest or smallest value of a
setting, :mod:`dprflow.finetuning.grid_edges`) is logged as a warning; selection.json stays as it
was, so that the warning retrains nothing.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.errors import StageError
from dprflow.files import atomic_path
from dprflow.finetuning.grid_edges import describe, grid_edges
from dprflow.finetuning.selection import SECTION_KEYS, best_point, point_name

log = logging.getLogger("dprflow.select_settings")


@dataclass
class Args:
    """Choose the fine-tuning settings on held-out training queries."""

    grid: str = field(metadata={"help": "the grid points' settings: a JSON list of objects, in grid order"})
    metrics: list[str] = field(metadata={"help": "each point's held-out metrics.parquet, in grid order"})
    metric: str = field(metadata={"help": "the ir_measures name the choice maximises"})
    out: str = field(metadata={"help": "selection.json to write"})
    section: str = field(
        default="retriever",
        metadata={"help": "whose settings the grid varies", "choices": list(SECTION_KEYS)},
    )
    first_stage: str | None = field(
        default=None,
        metadata={
            "help": "a reranker grid's first stage: the held-out metrics.parquet of the run it reranked"
        },
    )

    def check(self) -> None:
        if len(self.metrics) != len(json.loads(self.grid)):
            raise ValueError("--grid and --metrics must name the same points, in the same order")


def mean_metric(path: str, metric: str) -> float:
    table = read_table(path, "metrics")
    values = table.loc[table["metric"] == metric, "value"]
    if values.empty:
        raise StageError(f"{path}: no value of metric {metric!r}; metrics: {sorted(set(table['metric']))}")
    return float(values.mean())


def select(args: Args) -> dict:
    grid = json.loads(args.grid)
    values = {point_name(s): mean_metric(m, args.metric) for s, m in zip(grid, args.metrics, strict=True)}
    best = best_point(values)
    settings = grid[list(values).index(best)]
    ranked = sorted(values.values(), reverse=True)
    chosen = {
        "points": [
            {"point": n, "settings": s, "value": v} for (n, v), s in zip(values.items(), grid, strict=True)
        ],
        "best": best,
        "settings": settings,
        "margin": ranked[0] - ranked[1] if len(ranked) > 1 else None,
    }
    if args.first_stage:
        chosen["first_stage"] = mean_metric(args.first_stage, args.metric)
    selection = {"metric": args.metric, args.section: chosen}
    log.info("held-out %s: %s; best %s", args.metric, values, best)
    edges = grid_edges(grid, settings)
    if edges:  # the grid may not bracket the best (docs/selection.md)
        log.warning("%s is %s: a wider grid might do better", best, describe(edges))
    with atomic_path(args.out) as tmp, open(tmp, "w") as fh:
        json.dump(selection, fh, indent=2)
    return {"best": best, "value": values[best]}


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, select, argv, "select_settings")


if __name__ == "__main__":
    sys.exit(main())
