"""Probe every stage of a methods study for a few steps, to size its budgets (docs/methods-study.md).

A study's budgets (steps of each pre-training stage, epochs of fine-tuning) must be set before it
runs and before any test query is scored. This runs the study's own config with every training
stage cut to ``--steps`` optimizer steps, the query generator to 64 passages, fine-tuning to
retriever 1 and the trained collection only, from ``--init`` (the study's starting model, e.g.
the MLM base it trained: the probe does not train it again), up to every method's retriever 1
and the ``none`` row's embeddings of the collection. It prints, per job, its wall seconds (the
workflow's benchmark file) and, for a training job, the steps per second its log reports last,
as a Markdown table, and writes ``probes.json`` in ``--work``. Jobs run as the study runs them
(profiles/local: two jobs of one thread each at a time), so the rates are those the study sees.

    python bench/bench_study_probes.py --config config/examples/methods-scifact-mlm.yaml \\
        --init results/pretrain/mlm/model --work results/probes --steps 20

``--work`` is a workflow folder of its own: relative paths of the config (collections, the
generic corpus) are read from there, so it needs the same ``../shared`` and ``data/`` beside it
as the folder the study runs in.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from _common import ROOT

RATE = re.compile(r"step (\d+)/(\d+) loss \S+ \(([\d.]+) steps/s")


def probe_config(config: dict, init: str, steps: int) -> tuple[dict, str]:
    """The study config cut to a probe; returns it and the trained collection's name."""
    config = json.loads(json.dumps(config))
    config["model"]["init"] = init
    (trained,) = [c for c, spec in config["collections"].items() if not spec.get("evaluate_only")]
    config["collections"] = {trained: config["collections"][trained]}
    pt = config.setdefault("pretrain", {})
    for stage in ("condenser", "cocondenser", "contriever", "mlm"):
        pt.setdefault(stage, {})["max_steps"] = steps
    mae = pt.setdefault("mae", {})
    for part in ("generic", "corpus"):
        mae.setdefault(part, {})["max_steps"] = steps
    d2q = pt.setdefault("doc2query", {})
    d2q.setdefault("train", {})["max_steps"] = steps
    d2q["max_passages"] = 64
    ft = config.setdefault("finetune", {})
    ft["stages"], ft["stages_of"] = ["r1"], {}
    ft.setdefault("retriever", {})["max_steps"] = steps
    # one seed, no grid, nothing fused: each row's r1 once, as configured (a grid point trains at
    # the rate of the row it stands for)
    config.pop("seeds", None)
    config.pop("seeds_of", None)
    ft["select"] = {key: value for key, value in ft.get("select", {}).items() if key in ("metric", "seed")}
    ft["fusion"] = {"rows": []}
    # the references the probe's rows still have (it trains no retriever 2)
    ev = config.setdefault("evaluation", {})
    ev["also_against"] = [
        r for r in ev.get("also_against", []) if not r.endswith(("/r2", "/rerank", "/distill"))
    ]
    return config, trained


def last_rate(log: Path) -> tuple[int, float] | None:
    """(steps, steps/s) of the log's last progress line; None for a job that trains nothing."""
    found = None
    for line in log.read_text(errors="replace").splitlines():
        match = RATE.search(line)
        if match:
            found = (int(match.group(1)), float(match.group(3)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--init", required=True, help="the study's starting model (a folder)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    config, trained = probe_config(
        yaml.safe_load(args.config.read_text()), str(Path(args.init).resolve()), args.steps
    )
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "probe.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    seed = config["finetune"].get("seed", 13)  # the schema's default
    targets = [f"results/{trained}/{m}/seed-{seed}/r1/model" for m in config["methods"]]
    targets.append(f"results/{trained}/none/seed-{seed}/r1/embeddings/shard_0.parquet")
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    # The targets first: --configfile takes every value after it.
    command = [
        snakemake,
        *targets,
        "--profile",
        str(ROOT / "profiles" / "local"),
        "-s",
        str(ROOT / "Snakefile"),
    ]
    command += ["-d", str(args.work), "--configfile", str(args.work / "probe.yaml")]
    subprocess.run(command, check=True)
    rows = []
    for bench in sorted((args.work / "results" / "benchmarks").rglob("*.tsv")):
        with bench.open() as fh:
            seconds = float(next(csv.DictReader(fh, delimiter="\t"))["s"])
        job = bench.relative_to(args.work / "results" / "benchmarks").with_suffix("").as_posix()
        log = args.work / "results" / "logs" / (job + ".log")
        rate = last_rate(log) if log.is_file() else None
        rows.append({"job": job, "seconds": round(seconds, 1), "steps": rate and rate[0],
                     "steps_per_s": rate and rate[1]})  # fmt: skip
    (args.work / "probes.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("| job | wall s | steps | steps/s |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['job']} | {row['seconds']} | {row['steps'] or '-'} | {row['steps_per_s'] or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
