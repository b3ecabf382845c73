"""The paper presets train the papers' experiments: quantities derived from each preset's planned
jobs (a Snakemake dry run: the command lines, never run) against the papers' figures in
``config/presets/figures/papers.yaml``.

Derived per stage: optimizer steps (with the trainer's own :func:`total_steps` over the number of
items the stage iterates, from the table's sizes), documents / spans / queries and passages per
update, negatives per query and their pool, the corpus a stage reads, learning rates and
schedules, and the distillation objective.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from dprflow.training.trainer import TrainArgs, total_steps

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
FIGURES = yaml.safe_load((ROOT / "config" / "presets" / "figures" / "papers.yaml").read_text())


class Job(NamedTuple):
    rule: str
    wildcards: dict[str, str]
    flags: dict[str, str]


def planned_jobs(preset: Path, workdir: Path) -> list[Job]:
    """The jobs of a dry run (``-p``: with their shell commands), flags parsed."""
    config = yaml.safe_load(preset.read_text())
    path = config["pretrain"].get("generic_corpus", {}).get("path")
    if path:  # the user's corpus file must exist even for a dry run (tests/test_presets.py)
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).touch()
    env = {**os.environ, "IR_DATASETS_HOME": str(workdir / "ir_datasets_home")}
    cmd = [SNAKEMAKE, "-n", "-p", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(preset)]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    jobs = []
    for block in result.stdout.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0].strip()
        wc = re.search(r"^\s*wildcards: (.*)$", block, flags=re.MULTILINE)
        wildcards = dict(kv.split("=", 1) for kv in wc.group(1).split(", ")) if wc else {}
        shell = re.search(r"^Shell command: (.*)$", block, flags=re.MULTILINE)
        flags: dict[str, str] = {}
        if shell:
            tokens = shlex.split(shell.group(1).split(" > ")[0])
            for i, tok in enumerate(tokens):
                if tok.startswith("--") and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                    flags[tok[2:]] = tokens[i + 1]
        jobs.append(Job(rule, wildcards, flags))
    return jobs


def corpus_id(config: dict, passages_path: str) -> str:
    """The ir_datasets corpus (``msmarco-document``) behind ``results/<name>/passages.parquet``."""
    name = Path(passages_path).parent.name
    spec = config["collections"].get(name) or config["pretrain"]["corpora"][name]
    return next(iter(spec["ir_datasets"].values())).split("/")[0]


def size(kind: str, corpus: str) -> int:
    return FIGURES["sizes"][kind][corpus]["value"]


def steps(flags: dict[str, str], n_items: int) -> int:
    args = TrainArgs(batch_size=int(flags["batch-size"]), epochs=int(flags["epochs"]),
                     max_steps=int(flags["max-steps"]))  # fmt: skip
    return total_steps(n_items, args)


def schedule(flags: dict[str, str]) -> str:
    return f"linear, warm-up {float(flags['warmup-ratio']):g}"  # the trainer's only schedule


def retriever(config: dict, job: Job, jobs: list[Job]) -> dict[str, Any]:
    f = job.flags
    batch, group = int(f["batch-size"]), int(f["group-size"])
    main = corpus_id(config, f["passages"])
    out = {
        "corpus": main,
        "queries_per_update": batch,
        "passages_per_query": group,
        "passages_per_update": batch * group,
        "hard_negatives_per_query": group - 1,
        "negatives_per_query": batch * group - 1,
        "learning_rate": float(f["learning-rate"]),
        "epochs": int(f["epochs"]),
        "optimizer_steps": steps(f, size("training_queries", main)),
    }
    pools = []
    fraction = float(f.get("extra-fraction", 0))
    primary = "bm25" if "/bm25/" in f["negatives"] else "mined"
    if fraction < 1:
        pools.append(primary)
    if fraction > 0:
        pools.append("bm25" if "/bm25/" in f["extra-negatives"] else "mined")
    out["negative_pool"] = "+".join(sorted(pools))
    if primary == "mined":
        source = f["negatives"]
        mine = next(j for j in jobs if j.rule == "mine_negatives" and j.flags["out"] == source)
        out["mining_depth"] = int(mine.flags["depth"])
    if "teacher" in f:
        over = f.get("student-over", "group")
        if f["direction"] == "teacher_student":
            out["kl"] = f"KL(T||S), S over the {over}"
        else:
            out["kl"] = f"KL(S||T), S over the {over}"
        out["contrastive_weight"] = float(f["alpha"])
    return out


def derive(preset: str, config: dict, jobs: list[Job]) -> dict[str, dict[str, Any]]:
    stages: dict[str, dict[str, Any]] = {}
    method = {"msmarco-cocondenser": "cocondenser", "msmarco-cdmae": "cdmae"}[preset]
    names = {"r1": "retriever 1", "r2": "retriever 2", "distill": "distillation"}
    for job in jobs:
        f = job.flags
        if job.rule == "pretrain_generic":
            stages["condenser stage one"] = {
                "learning_rate": float(f["learning-rate"]),
                "schedule": schedule(f),
                "epochs": int(f["epochs"]),
                "early_layers": int(f["n-early"]),
                "head_layers": int(f["n-head-layers"]),
            }
        elif job.rule == "pretrain_corpus" and job.wildcards["cocondenser"] == "cocondenser":
            corpus = corpus_id(config, f["passages"])
            stages["cocondenser stage two"] = {
                "corpus": corpus,
                "optimizer_steps": steps(f, size("documents", corpus)),
                "documents_per_update": int(f["batch-size"]),
                "spans_per_update": 2 * int(f["batch-size"]),
                "span_max": int(f["span-max"]),
                "learning_rate": float(f["learning-rate"]),
                "schedule": schedule(f),
            }
        elif job.rule == "pretrain_mae_generic" and job.wildcards["mae"] == method:
            stages[f"{method} generic stage"] = {"runs": True}
        elif job.rule == "pretrain_mae_corpus" and job.wildcards["mae_method"] == method:
            corpus = corpus_id(config, f["corpus-path"])
            stages[f"{method} corpus stage"] = {
                "init": f["init"],
                "corpus": corpus,
                # bmae/cdmae rows are chunks of max_length - 2 tokens: one per passage of <= 148
                "optimizer_steps": steps(f, size("documents", corpus)),
                "sequences_per_update": int(f["batch-size"]),
                "learning_rate": float(f["learning-rate"]),
                "schedule": schedule(f),
                "p_enc": float(f["p-enc"]),
                "p_dec": float(f["p-dec"]),
                "projection": f["use-projection"] == "true",
                "decoder_layers": int(f["n-decoder-layers"]),
            }
        elif job.rule == "train_retriever" and job.wildcards["method"] == method:
            stages[names[job.wildcards["trained"]]] = retriever(config, job, jobs)
    stages.setdefault(f"{method} generic stage", {"runs": False})
    return stages


def same(actual: Any, expected: Any) -> bool:
    if isinstance(expected, float) or isinstance(actual, float):
        return isinstance(actual, int | float) and math.isclose(actual, expected, rel_tol=1e-9)
    return actual == expected


@pytest.mark.parametrize("preset", sorted(FIGURES["presets"]))
def test_preset_trains_the_papers_experiment(preset, tmp_path):
    path = ROOT / "config" / "presets" / f"{preset}.yaml"
    config = yaml.safe_load(path.read_text())
    derived = derive(preset, config, planned_jobs(path, tmp_path))
    wrong = []
    for stage, figures in FIGURES["presets"][preset].items():
        for quantity, figure in figures.items():
            actual = derived.get(stage, {}).get(quantity, "<not derived>")
            if not same(actual, figure["value"]):
                wrong.append(
                    f"{stage} / {quantity}: preset {actual!r}, paper {figure['value']!r} ({figure['source']})"
                )
    assert not wrong, "\n".join(wrong)


def test_the_figures_table_names_a_source_for_every_value():
    for preset, stages in FIGURES["presets"].items():
        assert (ROOT / "config" / "presets" / f"{preset}.yaml").is_file()
        for figures in stages.values():
            assert all(set(f) == {"value", "source"} and f["source"] for f in figures.values())
