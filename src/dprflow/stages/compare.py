"""Stage ``compare``: results/compare.md for people and results/compare.csv for programs."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dprflow.cli import StageError, run_stage
from dprflow.data.schemas import atomic_path, read_table
from dprflow.evaluation.compare import build_comparison, to_markdown

log = logging.getLogger("dprflow.compare")


@dataclass
class Args:
    """Aggregate every evaluated system into one table with significance markers."""

    metrics_files: list[str] = field(
        metadata={"help": "metrics.parquet files, as results/<collection>/<system>/metrics.parquet"}
    )
    results_dir: str = field(metadata={"help": "the results folder the paths are relative to"})
    out_md: str = field(metadata={"help": "Markdown table to write"})
    out_csv: str = field(metadata={"help": "long CSV to write"})
    metrics: list[str] = field(
        default_factory=lambda: ["RR@10", "R@50", "R@100", "R@1000", "nDCG@10"],
        metadata={"help": "metric columns, in order"},
    )
    methods: list[str] = field(
        default_factory=lambda: ["none"], metadata={"help": "method order of the rows"}
    )
    baseline: str = field(default="bm25", metadata={"help": "reference system of the significance tests"})
    splits: list[str] = field(
        default_factory=list,
        metadata={"help": "collection=split pairs: the query split scored in each collection"},
    )
    trained_on: list[str] = field(
        default_factory=list,
        metadata={"help": "collections whose scored split is their training split (score_training_queries)"},
    )
    paper_references: list[str] = field(
        default_factory=list,
        metadata={
            "help": "collection=evaluation-set pairs (e.g. msmarco=msmarco-passage/dev) to show the papers' figures"
        },
    )


def system_of(path: Path, results_dir: Path) -> tuple[str, str]:
    try:
        parts = path.resolve().relative_to(results_dir.resolve()).parts
    except ValueError as exc:
        raise StageError(f"{path}: not under the results folder {results_dir}") from exc
    if len(parts) < 3 or parts[-1] != "metrics.parquet":
        raise StageError(f"{path}: expected <results>/<collection>/<system>/metrics.parquet")
    return parts[0], "/".join(parts[1:-1])


def parse_pairs(pairs: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise StageError(f"{flag}: expected collection=value, got {pair!r}")
        out[key] = value
    return out


def compare(args: Args) -> None:
    results = Path(args.results_dir)
    per_query = {system_of(Path(p), results): read_table(p, "metrics") for p in args.metrics_files}
    references = [args.baseline] + [s for s in ("none/zeroshot",) if s != args.baseline]
    table = build_comparison(per_query, references)
    table = table[table["metric"].isin(args.metrics)].copy()
    splits = parse_pairs(args.splits, "--splits")
    if splits:
        table.insert(2, "split", table["collection"].map(splits))
        table.insert(3, "training_queries", table["collection"].isin(args.trained_on))
    with atomic_path(args.out_csv) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    with atomic_path(args.out_md) as tmp:
        tmp.write_text(
            "# dprflow comparison\n\n"
            + to_markdown(table, references, args.methods, args.metrics, splits, args.trained_on)
        )
    log.info(
        "compared %d systems on %d collections", table["system"].nunique(), table["collection"].nunique()
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, compare, argv, "compare")


if __name__ == "__main__":
    sys.exit(main())
