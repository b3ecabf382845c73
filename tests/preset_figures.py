"""The figures a preset trains, derived from its planned jobs (a Snakemake dry run: the command
lines, never run): :func:`planned_jobs` parses the dry run, :func:`derive` computes the quantities
``config/presets/figures/papers.yaml`` lists, :func:`wrong_figures` compares the two. Used by
tests/test_preset_figures.py (each preset against its figures), tests/test_preset_mutations.py
(an edited preset is caught) and tests/test_memory_estimates.py (the presets' jobs)."""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from snakemake_cli import snakemake as run_snakemake

from dprflow.stage_args import TrainArgs
from dprflow.training.trainer import steps_run, total_steps

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
FIGURES_FILE = ROOT / "config" / "presets" / "figures" / "papers.yaml"
FIGURES = yaml.safe_load(FIGURES_FILE.read_text())


class Job(NamedTuple):
    rule: str
    wildcards: dict[str, str]
    flags: dict[str, str]  # --flag value (several values joined by a space)
    processes: int  # torchrun --nproc-per-node, else 1


def planned_jobs(preset: Path, workdir: Path) -> list[Job]:
    """The jobs of a dry run (``-p``: with their shell commands), flags parsed."""
    config = yaml.safe_load(preset.read_text())
    path = (config.get("pretrain") or {}).get("generic_corpus", {}).get("path")
    if path:  # the user's corpus file must exist even for a dry run (tests/test_presets.py)
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).touch()
    env = {**os.environ, "IR_DATASETS_HOME": str(workdir / "ir_datasets_home")}
    cmd = [SNAKEMAKE, "-n", "-p", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(preset)]  # fmt: skip
    result = run_snakemake(cmd, cwd=ROOT, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    jobs = []
    for block in result.stdout.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0].strip()
        wc = re.search(r"^\s*wildcards: (.*)$", block, flags=re.MULTILINE)
        wildcards = dict(kv.split("=", 1) for kv in wc.group(1).split(", ")) if wc else {}
        shell = re.search(r"^Shell command: (.*)$", block, flags=re.MULTILINE)
        flags: dict[str, str] = {}
        processes = 1
        if shell:
            tokens = shlex.split(shell.group(1).split(" > ")[0])
            for i, tok in enumerate(tokens):
                if tok.startswith("--"):
                    values = []
                    for value in tokens[i + 1 :]:
                        if value.startswith("--"):
                            break
                        values.append(value)
                    flags[tok[2:]] = " ".join(values)
            processes = int(flags.pop("nproc-per-node", 1))
        jobs.append(Job(rule, wildcards, flags, processes))
    return jobs


def corpus_id(config: dict, passages_path: str) -> str:
    """The ir_datasets corpus (``msmarco-document``) behind ``results/<name>/passages.parquet``."""
    name = Path(passages_path).parent.name
    spec = config["collections"].get(name) or config["pretrain"]["corpora"][name]
    return next(iter(spec["ir_datasets"].values())).split("/")[0]


def size(kind: str, corpus: str) -> int:
    return FIGURES["sizes"][kind][corpus]["value"]


def train_args(flags: dict[str, str]) -> TrainArgs:
    return TrainArgs(batch_size=int(flags["batch-size"]), epochs=int(flags["epochs"]),
                     max_steps=int(flags["max-steps"]),
                     stop_at_step=int(flags.get("stop-at-step", 0)))  # fmt: skip


def steps(flags: dict[str, str], n_items: int) -> int:
    """Optimizer steps the stage runs (the trainer's own count)."""
    return steps_run(n_items, train_args(flags))


def schedule(flags: dict[str, str], n_items: int) -> str:
    """The trainer's only schedule: linear with warm-up, over its total_steps."""
    return f"linear, warm-up {float(flags['warmup-ratio']):g}, over {total_steps(n_items, train_args(flags))} steps"


def micro_batch(job: Job) -> int:
    """Examples of one contrastive batch: each process's batch split into
    gradient_accumulation_steps micro-batches, gathered over the processes."""
    batch = int(job.flags["batch-size"])
    accumulation = int(job.flags.get("gradient-accumulation-steps", 1))
    per_process = batch // job.processes
    return (per_process // accumulation) * job.processes


def gradient_cache(job: Job, rows: int) -> bool:
    """Whether a step of ``rows`` encoded sequences runs with a gradient cache (chunks below it)."""
    chunk = int(job.flags.get("chunk-size", 0))
    return 0 < chunk < rows


def masking(flags: dict[str, str]) -> str:
    if flags.get("whole-word") == "true":
        return f"whole words, {flags['whole-word-count']} count"
    return "tokens (BERT)"


def spans(flags: dict[str, str]) -> str:
    if flags["spans"] == "non_overlapping":
        return f"two non-overlapping spans of {flags['span-max']} tokens"
    return f"two independent spans of {flags['span-min']}-{flags['span-max']} tokens"


def retriever(config: dict, job: Job, jobs: list[Job]) -> dict[str, Any]:
    f = job.flags
    batch, group = int(f["batch-size"]), int(f["group-size"])
    main = corpus_id(config, f["passages"])
    micro = micro_batch(job)
    out = {
        "corpus": main,
        "init": f["init"],
        "queries_per_update": batch,
        "passages_per_query": group,
        "passages_per_update": batch * group,
        "hard_negatives_per_query": group - 1,
        "negatives_per_query": micro * group - 1,
        "learning_rate": float(f["learning-rate"]),
        "weight_decay": float(f["weight-decay"]),
        "schedule": schedule(f, size("training_queries", main)),
        "epochs": int(f["epochs"]),
        "optimizer_steps": steps(f, size("training_queries", main)),
        "max_passage_length": int(f["max-passage-length"]),
        "max_query_length": int(f["max-query-length"]),
        "temperature": float(f.get("temperature", 1.0)),
        "seed": int(f["seed"]),
    }
    fraction = float(f.get("extra-fraction", 0))
    primary = "bm25" if "/bm25/" in f["negatives"] else "mined"
    n_extra = int(round((group - 1) * fraction)) if fraction > 0 else 0  # examples.sample_group
    counts = {primary: group - 1 - n_extra}
    if n_extra:
        extra = "bm25" if "/bm25/" in f["extra-negatives"] else "mined"
        counts[extra] = counts.get(extra, 0) + n_extra
    counts = {k: v for k, v in counts.items() if v}
    out["negative_pool"] = "+".join(sorted(counts))
    out["hard_negatives_per_group"] = " + ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    pools = [f["negatives"]] + ([f["extra-negatives"]] if n_extra else [])
    for pool in pools:
        if "/bm25/" in pool:
            make = next(j for j in jobs if j.rule == "bm25_negatives" and j.flags["out"] == pool)
            out["bm25_depth"] = int(make.flags["depth"])
        else:
            make = next(j for j in jobs if j.rule == "mine_negatives" and j.flags["out"] == pool)
            out["mining_depth"] = int(make.flags["depth"])
    if "teacher" in f:
        over = f.get("student-over", "group")
        if f["direction"] == "teacher_student":
            out["kl"] = f"KL(T||S), S over the {over}"
        else:
            out["kl"] = f"KL(S||T), S over the {over}"
        out["contrastive_weight"] = float(f["alpha"])
        score = next(j for j in jobs if j.rule == "score_candidates" and j.flags["out"] == f["teacher"])
        out["candidates"] = int(score.flags["candidates"])
    return out


def cocondenser_stage(config: dict, job: Job) -> dict[str, Any]:
    f = job.flags
    corpus = corpus_id(config, f["passages"])
    documents = int(f["batch-size"])
    out = {
        "init": f["init"],
        "corpus": corpus,
        "optimizer_steps": steps(f, size("documents", corpus)),
        "schedule": schedule(f, size("documents", corpus)),
        "documents_per_update": documents,
        "spans_per_update": 2 * documents,
        # eq. 6 over the spans of one micro-batch: each span's sibling is its positive
        "contrastive_spans": 2 * micro_batch(job),
        "gradient_cache": gradient_cache(job, 2 * micro_batch(job)),
        "mlm_probability": float(f["mlm-probability"]),
        "masking": masking(f),
        "learning_rate": float(f["learning-rate"]),
        "weight_decay": float(f["weight-decay"]),
    }
    if "queries" in f:  # query-as-context: a passage and one of its generated queries
        out["pairs"] = f"passage of {f['max-passage-tokens']} tokens + generated query"
        out["queries_of"] = corpus_id(config, str(Path(f["queries"]).parent))
    else:
        out["pairs"] = spans(f)
        out["shortest_document"] = int(f["span-min"])
    return out


def mae_stage(config: dict, job: Job) -> dict[str, Any]:
    f = job.flags
    corpus = corpus_id(config, f["corpus-path"])
    out = {
        "init": f["init"],
        "corpus": corpus,
        # cotmae: a document per item; bmae/cdmae: a passage (<= 144 tokens) per chunk
        "optimizer_steps": steps(f, size("documents", corpus)),
        "schedule": schedule(f, size("documents", corpus)),
        "sequences_per_update": int(f["batch-size"]),
        "learning_rate": float(f["learning-rate"]),
        "weight_decay": float(f["weight-decay"]),
        "p_enc": float(f["p-enc"]),
        "p_dec": float(f["p-dec"]),
        "projection": f["use-projection"] == "true",
        "decoder_layers": int(f["n-decoder-layers"]),
        "max_length": int(f["max-length"]),
    }
    if f["variant"] == "cdmae":
        out["sigma"] = float(f["sigma"])
    if f["variant"] == "cotmae":
        out["span_max"] = int(f["span-max"])
    if "queries" in f:
        out["queries_of"] = corpus_id(config, str(Path(f["queries"]).parent))
    return out


def derive(config: dict, jobs: list[Job]) -> dict[str, dict[str, Any]]:
    stages: dict[str, dict[str, Any]] = {}
    names = {"r1": "retriever 1", "r2": "retriever 2", "distill": "distillation"}
    stages["condenser stage one"] = {"runs": any(j.rule == "pretrain_generic" for j in jobs)}
    stages["mae generic stage"] = {"runs": any(j.rule == "pretrain_mae_generic" for j in jobs)}
    for job in jobs:
        f = job.flags
        if job.rule == "pretrain_generic":
            stages["condenser stage one"].update(
                {
                    "learning_rate": float(f["learning-rate"]),
                    "epochs": int(f["epochs"]),
                    "early_layers": int(f["n-early"]) if "n-early" in f else "half",
                    "head_layers": int(f["n-head-layers"]),
                }
            )
        elif job.rule == "pretrain_corpus":
            stages[f"{job.wildcards['cocondenser']} stage two"] = cocondenser_stage(config, job)
        elif job.rule == "pretrain_mae_corpus":
            stages[f"{job.wildcards['mae_method']} corpus stage"] = mae_stage(config, job)
        elif job.rule == "pmi_count":
            stages["pmi"] = {"max_n": int(f["max-n"])}
        elif job.rule == "doc2query":
            stages["doc2query"] = {
                "model": f["model"],
                "input_prefix": f.get("input-prefix", ""),
                "queries_per_passage": int(f["n-queries"]),
            }
        elif job.rule == "train_retriever":
            stage = f"{job.wildcards['method']} {names[job.wildcards['trained']]}"
            stages[stage] = retriever(config, job, jobs)
        elif job.rule == "train_reranker":
            stages[f"{job.wildcards['method']} reranker"] = {
                "init": f["init"],
                "depth": int(next(j for j in jobs if j.rule == "rerank").flags["depth"]),
            }
        elif job.rule == "evaluate":
            stages.setdefault("evaluation", {})["metrics"] = f["metrics"]
        elif job.rule == "search_dense":
            stages.setdefault("evaluation", {})["dense_depth"] = int(f["depth"])
    return stages


def same(actual: Any, expected: Any) -> bool:
    if isinstance(expected, float) or isinstance(actual, float):
        return isinstance(actual, int | float) and math.isclose(actual, expected, rel_tol=1e-9)
    return actual == expected


def wrong_figures(preset_name: str, path: Path, workdir: Path) -> list[str]:
    """Every figure of ``preset_name`` in the table that the preset at ``path`` does not train."""
    config = yaml.safe_load(path.read_text())
    derived = derive(config, planned_jobs(path, workdir))
    wrong = []
    for stage, figures in FIGURES["presets"][preset_name].items():
        for quantity, figure in figures.items():
            actual = derived.get(stage, {}).get(quantity, "<not derived>")
            if not same(actual, figure["value"]):
                wrong.append(
                    f"{stage} / {quantity}: preset {actual!r}, figure {figure['value']!r} ({figure['source']})"
                )
    return wrong
