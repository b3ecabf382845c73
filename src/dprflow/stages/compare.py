"""Stage ``compare``: results/compare.md for people and results/compare.csv for programs.

A row's files live in ``<results>/<collection>/<system>/``; a row scored on another collection
than the one it trained on (transfer) in ``<results>/<training collection>/<system>/on-<scored
collection>/``. Every row but those of ``--untrained-rows`` (BM25, the off-the-shelf models) is
recorded with the collection it was trained on (compare.csv's ``training_collection``)."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.errors import StageError
from dprflow.evaluation.compare import SIGNIFICANCE_TESTS, build_comparison, to_markdown
from dprflow.files import atomic_path
from dprflow.finetuning.grid_edges import describe, grid_edges
from dprflow.plan.rows import BM25, OFF_THE_SHELF, split_seed, split_transfer

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
    encoder_files: list[str] = field(
        default_factory=list,
        metadata={
            "help": "encoder.json files of the dense runs, as results/<collection>/<system>/encoder.json "
            "(the pooling and similarity shown beside each row)"
        },
    )
    baseline: str = field(default="bm25", metadata={"help": "reference system of the significance tests"})
    also_against: list[str] = field(
        default_factory=list,
        metadata={"help": "more reference systems, after the baseline and none/zeroshot (e.g. none/r1)"},
    )
    significance: str = field(
        default="t-test",
        metadata={"help": "paired test over queries", "choices": list(SIGNIFICANCE_TESTS)},
    )
    permutations: int = field(
        default=10000,
        metadata={"help": "randomization test: random sign assignments (exact when 2^n is fewer)"},
    )
    permutation_seed: int = field(default=0, metadata={"help": "randomization test: seed of the assignments"})
    splits: list[str] = field(
        default_factory=list,
        metadata={"help": "collection=split pairs: the query split scored in each collection"},
    )
    trained_on: list[str] = field(
        default_factory=list,
        metadata={"help": "collections whose scored split is their training split (score_training_queries)"},
    )
    untrained_rows: list[str] = field(
        default_factory=lambda: [BM25, OFF_THE_SHELF],
        metadata={"help": "rows that train nothing on a collection (BM25, the off-the-shelf models)"},
    )
    selection_files: list[str] = field(
        default_factory=list,
        metadata={
            "help": "selection.json files (stage select_settings): the held-out choices shown below the table"
        },
    )
    paper_references: list[str] = field(
        default_factory=list,
        metadata={
            "help": "collection=evaluation-set pairs (e.g. msmarco=msmarco-passage/dev) to show the papers' figures"
        },
    )


def system_of(path: Path, results_dir: Path, name: str = "metrics.parquet") -> tuple[str, str]:
    try:
        parts = path.resolve().relative_to(results_dir.resolve()).parts
    except ValueError as exc:
        raise StageError(f"{path}: not under the results folder {results_dir}") from exc
    if len(parts) < 3 or parts[-1] != name:
        raise StageError(f"{path}: expected <results>/<collection>/<system>/{name}")
    return parts[0], "/".join(parts[1:-1])


def row_of(
    path: Path, results_dir: Path, untrained: list[str], name: str = "metrics.parquet"
) -> tuple[str, str, str]:
    """(scored collection, system, training collection) of a row's file; the training collection
    is empty for an untrained row."""
    collection, system = system_of(path, results_dir, name)
    row, target = split_transfer(system)
    if target:
        return target, row, collection
    return collection, system, "" if split_seed(system)[0] in untrained else collection


def read_geometry(paths: list[str], results_dir: Path, untrained: list[str]) -> pd.DataFrame:
    """``collection, system, training_collection, pooling, similarity`` of each dense run's
    ``encoder.json``, systems named as in the table (the seeds of a row gathered; seeds trained
    alike give one row)."""
    rows = []
    for path in paths:
        collection, system, trained = row_of(Path(path), results_dir, untrained, "encoder.json")
        try:
            record = json.loads(Path(path).read_text())
            rows.append((collection, split_seed(system)[0], trained, record["pooling"], record["similarity"]))
        except (json.JSONDecodeError, KeyError) as exc:
            raise StageError(f"{path}: expected JSON with pooling and similarity ({exc})") from exc
    keys = ["collection", "system", "training_collection"]
    frame = pd.DataFrame(rows, columns=[*keys, "pooling", "similarity"]).drop_duplicates()
    twice = frame[frame.duplicated(keys, keep=False)]
    if not twice.empty:
        raise StageError(
            f"the seeds of {twice.iloc[0]['collection']} {twice.iloc[0]['system']} used different geometries"
        )
    return frame


def parse_pairs(pairs: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise StageError(f"{flag}: expected collection=value, got {pair!r}")
        out[key] = value
    return out


# The grids of selection.json (finetune.select), as the comparison names them.
GRIDS = {
    "retriever": "retriever settings",
    "negatives": "retriever 2's negatives (share from BM25)",
    "reranker": "reranker settings",
    "distill": "distillation settings",
}


def selections_markdown(paths: list[str], results: Path) -> str:
    """What was chosen on held-out training queries (docs/selection.md), a table row per choice:
    every grid point's (selection.json: the retriever's, the negatives' mix's, the reranker's
    beside the BM25 run its points reranked) and every fusion weight's (fusion.json) held-out value, the winner and its
    margin."""
    if not paths:
        return ""
    metric = json.loads(Path(paths[0]).read_text())["metric"]
    lines = [
        "",
        "## Chosen on held-out training queries",
        "",
        f"Held-out {metric} of each candidate; no test query was read (docs/selection.md).",
        "",
        "| where | what | candidates | chosen |",
        "|---|---|---|---|",
    ]
    for path in paths:
        chosen = json.loads(Path(path).read_text())
        where = Path(path).parent.relative_to(results).as_posix()
        for section, what in GRIDS.items():
            grid = chosen.get(section)
            if not grid or len(grid["points"]) < 2:
                continue
            tried = ", ".join(f"{p['point']}: {p['value']:.4f}" for p in grid["points"])
            best = f"{grid['best']} (by {grid['margin']:.4f}"
            if "first_stage" in grid:  # what the points reranked, alone
                best += f"; BM25 alone {grid['first_stage']:.4f}"
            edges = grid_edges([p["settings"] for p in grid["points"]], grid["settings"])
            if edges:
                best += f"; {describe(edges)}"
            lines.append(f"| {where} | {what} | {tried} | {best}) |")
        if "weights" in chosen:  # select_fusion's fusion.json
            tried = ", ".join(
                f"{w['normalization']} {w['weight']:g}: {w['value']:.4f}" for w in chosen["weights"]
            )
            alone = chosen["alone"]
            best = (
                f"{chosen['normalization']} {chosen['weight']:g} ({chosen['value']:.4f};"
                f" dense alone {alone['dense']:.4f}, BM25 {alone['bm25']:.4f})"
            )
            lines.append(f"| {where} | dense weight with BM25 ({chosen['method']}) | {tried} | {best} |")
    return "\n".join(lines) + "\n"


def compare(args: Args) -> None:
    results = Path(args.results_dir)
    per_query = {
        row_of(Path(p), results, args.untrained_rows): read_table(p, "metrics") for p in args.metrics_files
    }
    references = list(dict.fromkeys([args.baseline, OFF_THE_SHELF, *args.also_against]))
    if args.permutations < 1:
        raise StageError(f"--permutations must be >= 1, got {args.permutations}")
    table = build_comparison(
        per_query, references, args.significance, args.permutations, args.permutation_seed
    )
    table = table[table["metric"].isin(args.metrics)].copy()
    splits = parse_pairs(args.splits, "--splits")
    if splits:
        table.insert(2, "split", table["collection"].map(splits))
        # the scored queries are training queries only for the rows trained on that collection
        trained = table["training_collection"]
        own = trained.eq("") | trained.eq(table["collection"])
        table.insert(3, "training_queries", table["collection"].isin(args.trained_on) & own)
    if args.encoder_files:
        table = table.merge(
            read_geometry(args.encoder_files, results, args.untrained_rows),
            on=["collection", "system", "training_collection"],
            how="left",
        )
    with atomic_path(args.out_csv) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    with atomic_path(args.out_md) as tmp:
        tmp.write_text(
            "# dprflow comparison\n\n"
            + to_markdown(
                table,
                references,
                args.methods,
                args.metrics,
                splits,
                args.trained_on,
                args.significance,
                args.permutations,
            )
            + selections_markdown(args.selection_files, results)
        )
    log.info(
        "compared %d systems on %d collections", table["system"].nunique(), table["collection"].nunique()
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, compare, argv, "compare")


if __name__ == "__main__":
    sys.exit(main())
