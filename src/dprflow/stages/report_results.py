"""Stage ``report_results``: the figures and pages of the Snakemake report
(``snakemake --report results/report.html``): training-loss curves, nb-recall curves, the main
metric as grouped bars, the comparison with each row's provenance, and the config used."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.evaluation import plots, report
from dprflow.files import atomic_path

log = logging.getLogger("dprflow.report_results")


@dataclass
class Args:
    """Draw the report's figures and write its pages."""

    compare_csv: str = field(metadata={"help": "results/compare.csv"})
    compare_md: str = field(metadata={"help": "results/compare.md"})
    results_dir: str = field(metadata={"help": "the results folder"})
    config_json: str = field(metadata={"help": "the workflow config, as JSON"})
    out_loss: str = field(metadata={"help": "training-loss figure (PNG)"})
    out_nb_recall: str = field(metadata={"help": "nb-recall figure (PNG)"})
    out_metric: str = field(metadata={"help": "main-metric figure (PNG)"})
    out_html: str = field(metadata={"help": "comparison page with provenance (HTML)"})
    out_config: str = field(metadata={"help": "the config used (YAML)"})
    metric: str = field(default="RR@10", metadata={"help": "the metric of the bar chart"})
    nb_recall: list[str] = field(default_factory=list, metadata={"help": "nb_recall.parquet files"})
    models: list[str] = field(default_factory=list, metadata={"help": "model folders of training stages"})


def build(args: Args) -> None:
    results = Path(args.results_dir)
    table = pd.read_csv(args.compare_csv)
    with atomic_path(args.out_metric) as tmp:
        plots.main_metric(table, args.metric, tmp)
    frames = []
    for path in args.nb_recall:
        parts = (
            Path(path).resolve().relative_to(results.resolve()).parts
        )  # <collection>/<method>/seed-<seed>/nb_recall.parquet
        frames.append(read_table(path, "nb_recall").assign(collection=parts[0], method=parts[1]))
    # one line per method: the mean over its seeds (none where no method has retriever 2)
    columns = ["collection", "method", "n", "k", "value"]
    nb = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    nb = nb.groupby(columns[:-1], sort=False)
    with atomic_path(args.out_nb_recall) as tmp:
        plots.nb_recall(nb["value"].mean().reset_index(), tmp)
    logs = report.training_logs(args.models, results)
    with atomic_path(args.out_loss) as tmp:
        plots.training_loss(logs, tmp)
    with atomic_path(args.out_html) as tmp:
        tmp.write_text(report.comparison_page(Path(args.compare_md).read_text(), results, table, args.models))
    with atomic_path(args.out_config) as tmp:
        tmp.write_text(yaml.safe_dump(json.loads(args.config_json), sort_keys=False))
    log.info(
        "report pieces: %d training logs (%d steps), %d nb-recall tables, %d table rows",
        len(args.models),
        len(logs),
        len(frames),
        table[["collection", "system"]].drop_duplicates().shape[0],
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, build, argv, "report_results")


if __name__ == "__main__":
    sys.exit(main())
