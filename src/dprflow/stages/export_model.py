"""Stage ``export_model``: a trained model folder ready to upload, its card holding its metrics.

A model's card is written when it is trained, before the comparison exists. After the
comparison, this stage writes ``<out>/`` (``hub/`` beside the row's ``model/``): the model's files
copied (reflinks where the file system has them; never hard links, which made a file written into
``hub/`` the workflow's own model), without the training-run files a hub repository
does not need (TensorBoard events, provenance), and a ``README.md`` whose Hugging Face metadata
holds a ``model-index`` with the row's metrics from ``compare.csv``. ``huggingface-cli upload
<repo> <out>`` publishes it as is.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dprflow.cli import run_stage
from dprflow.errors import StageError
from dprflow.files import umask_mode
from dprflow.models.st_format import (
    CARD_FILE,
    TRAINING_ARGS_FILE,
    card_with_metrics,
    comparison_metrics,
    row_name,
)
from dprflow.training.store import clone_file

log = logging.getLogger("dprflow.export_model")

# training-run files; the card is rewritten; Snakemake's stamp of the model folder
LEFT_OUT = {"events", "provenance.json", CARD_FILE, ".snakemake_timestamp"}


@dataclass
class Args:
    """Write an upload-ready copy of a trained model whose card holds the comparison's metrics."""

    model: str = field(metadata={"help": "the trained model folder (its README.md and training_args.json)"})
    compare_csv: str = field(metadata={"help": "results/compare.csv"})
    collection: str = field(metadata={"help": "the collection the row was scored on"})
    out: str = field(metadata={"help": "folder to write"})


def copy_tree(src: Path, dst: Path) -> None:
    """Copy every file of ``src`` into ``dst`` (a reflink where the file system has them: no space
    used, and a write to either file never reaches the other), leaving out :data:`LEFT_OUT`. Never
    a hard link: an export is handed to users and tools that may overwrite its files in place, and
    the workflow keeps reading the model folder it was copied from."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if rel.parts[0] in LEFT_OUT or path.is_dir():
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        clone_file(path, target)


def export(args: Args) -> None:
    model = Path(args.model)
    record = json.loads((model / TRAINING_ARGS_FILE).read_text())
    reranker = (model / "dprflow_reranker.json").is_file()
    if reranker:
        record["role"] = "rerank"
    table = pd.read_csv(args.compare_csv)
    metrics = comparison_metrics(table, args.collection, row_name(record))
    if not metrics:
        raise StageError(f"{args.compare_csv}: no row {row_name(record)!r} on collection {args.collection!r}")
    pipeline, tags = (
        ("text-ranking", ["cross-encoder", "reranker"])
        if reranker
        else ("sentence-similarity", ["dense-retrieval"])
    )
    card = card_with_metrics((model / CARD_FILE).read_text(), record, pipeline, tags, metrics)
    out = Path(args.out)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copy_tree(model, tmp)
    (tmp / CARD_FILE).write_text(card)
    os.chmod(tmp, umask_mode(directory=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log.info("%s: %s with %d metrics of row %s", out, model, len(metrics), row_name(record))


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, export, argv, "export_model")


if __name__ == "__main__":
    sys.exit(main())
