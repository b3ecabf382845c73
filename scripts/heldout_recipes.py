"""Compare fine-tuning recipes on held-out training queries, before a study scores any test query.

Each recipe (``--recipe NAME:key=value,...``, keys of ``finetune.retriever``) fine-tunes the
``none`` row (retriever 1, from ``--init``) on a held-out copy of the collection that
``scripts/heldout_split.py`` wrote: it trains on the copy's ``qrels/train.tsv`` and is scored on
its ``qrels/dev.tsv``, and the copy holds no test query. Everything else is the study config's
(``--config``). Each recipe runs as a workflow of its own in ``--work/<name>`` (one after the
other, as ``make run`` runs); the table printed at the end gives, per recipe, BM25, the initial
model off the shelf and retriever 1 on the held-out queries, from each run's ``compare.csv``.

    python scripts/heldout_split.py ../shared/collections/scifact results/heldout/scifact
    python scripts/heldout_recipes.py --config config/examples/methods-scifact-mlm.yaml \\
        --init results/pretrain/mlm/model --heldout results/heldout/scifact \\
        --work results/recipes --recipe e1:epochs=1 --recipe e4-lr1e-4:epochs=4,learning_rate=1e-4
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def parse_recipe(text: str) -> tuple[str, dict]:
    """``NAME:key=value,...`` as (name, {key: value}), values read by :func:`scalar`."""
    name, _, pairs = text.partition(":")
    if not name or not pairs:
        raise argparse.ArgumentTypeError(f"--recipe {text!r}: expected NAME:key=value[,key=value]")
    settings = {}
    for pair in pairs.split(","):
        key, sep, value = pair.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--recipe {text!r}: {pair!r} is not key=value")
        settings[key.strip()] = scalar(value.strip())
    return name, settings


def scalar(text: str):
    """An int, a float (2e-5 too, which YAML 1.1 reads as a string) or YAML's reading of ``text``."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def recipe_config(config: dict, init: str, heldout: str, settings: dict) -> dict:
    """The study config reduced to the none row's retriever 1 on the held-out copy."""
    config = json.loads(json.dumps(config))
    config["model"]["init"] = init
    (trained,) = [c for c, spec in config["collections"].items() if not spec.get("evaluate_only")]
    spec = dict(config["collections"][trained], path=heldout, eval_split="dev", train_split="train")
    config["collections"] = {f"{trained}-heldout": spec}
    config["methods"] = ["none"]
    # none pre-trains nothing: the generic corpus (a path relative to the study's folder) is unread.
    config.setdefault("pretrain", {})["generic_corpus"] = {"source": "pydoc", "path": None}
    config["evaluation"]["also_against"] = []
    ft = config.setdefault("finetune", {})
    ft["stages"], ft["stages_of"] = ["r1"], {}
    ft.setdefault("retriever", {}).update(settings)
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--init", required=True, help="the study's starting model (a folder)")
    parser.add_argument("--heldout", type=Path, required=True, help="scripts/heldout_split.py's copy")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--recipe", type=parse_recipe, action="append", required=True)
    args = parser.parse_args()
    study = yaml.safe_load(args.config.read_text())
    init, heldout = str(Path(args.init).resolve()), str(args.heldout.resolve())
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    table = []
    for name, settings in args.recipe:
        work = args.work / name
        work.mkdir(parents=True, exist_ok=True)
        (work / "recipe.yaml").write_text(
            yaml.safe_dump(recipe_config(study, init, heldout, settings), sort_keys=False)
        )
        subprocess.run(
            [snakemake, "results/compare.csv", "--profile", str(ROOT / "profiles" / "local"),
             "-s", str(ROOT / "Snakefile"), "-d", str(work), "--configfile", str(work / "recipe.yaml")],
            check=True,
        )  # fmt: skip
        with (work / "results" / "compare.csv").open() as fh:
            for row in csv.DictReader(fh):
                table.append(
                    {"recipe": name, **{k: row[k] for k in ("system", "metric", "value", "n_queries")}}
                )
    (args.work / "recipes.json").write_text(json.dumps(table, indent=2) + "\n")
    metrics = list(dict.fromkeys(row["metric"] for row in table))
    print("| recipe | row | " + " | ".join(metrics) + " |")
    print("|---|---|" + "---:|" * len(metrics))
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for row in table:
        cells.setdefault((row["recipe"], row["system"]), {})[row["metric"]] = row["value"]
    for (recipe, system), values in cells.items():
        print(f"| {recipe} | {system} | " + " | ".join(values.get(m, "-") for m in metrics) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
