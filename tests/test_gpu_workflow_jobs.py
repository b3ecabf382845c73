"""scripts/gpu_workflow_jobs.py: each job's rule, wall time and device, read from a run's files."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location(
        "gpu_workflow_jobs", ROOT / "scripts" / "gpu_workflow_jobs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SNAKEMAKE_LOG = """Building DAG of jobs...
localrule train_retriever:
    input: results/tiny/bm25/negatives.parquet
    output: results/tiny/m/r1/model
    log: results/logs/tiny/m/r1/train_retriever.log
    jobid: 3
    benchmark: results/benchmarks/tiny/m/r1/train_retriever.tsv
    wildcards: collection=tiny
Select jobs to execute...
rule evaluate:
    input: results/tiny/m/r1/run.parquet
    log: results/logs/tiny/evaluate/m/r1.log
    benchmark: results/benchmarks/tiny/evaluate/m/r1.tsv
localrule all:
    input: results/compare.md
    jobid: 0
"""


def test_rule_seconds_and_device_of_each_benchmarked_job(tmp_path):
    jobs = load_script()
    (tmp_path / ".snakemake" / "log").mkdir(parents=True)
    (tmp_path / ".snakemake" / "log" / "2026-11-28T000000.snakemake.log").write_text(SNAKEMAKE_LOG)
    for rel, seconds in (("tiny/m/r1/train_retriever", "17.62"), ("tiny/evaluate/m/r1", "0.91")):
        tsv = tmp_path / "results" / "benchmarks" / f"{rel}.tsv"
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:17\t100.0\n")
    log = tmp_path / "results" / "logs" / "tiny" / "m" / "r1" / "train_retriever.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        "INFO start\nINFO dprflow.training.trainer: device cuda:0, NVIDIA H200 (139.8 GiB): bf16\n"
    )
    out = tmp_path / "jobs.csv"
    assert jobs.main([str(tmp_path), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert rows == [
        {
            "rule": "train_retriever",
            "target": "tiny/m/r1/train_retriever",
            "seconds": "17.62",
            "device": "cuda:0",
        },
        {"rule": "evaluate", "target": "tiny/evaluate/m/r1", "seconds": "0.91", "device": ""},
    ]


def test_the_device_of_each_stage_log_line():
    jobs = load_script()
    lines = {
        "encode_corpus: shard 0/1: 302 passages, precision bf16 on cuda:0, prompt ''": "cuda:0",
        "search_dense: queries encoded on cpu; prompts: query '', passage ''": "cpu",
        "reranking: scoring in bf16 on cuda:1": "cuda:1",
        "evaluate: nDCG@10 0.5 on 14 queries": None,
    }
    for line, device in lines.items():
        match = jobs.DEVICE.search(line)
        assert (match.group(1) if match else None) == device, line


def test_no_snakemake_log_is_an_error(tmp_path, capsys):
    assert load_script().main([str(tmp_path)]) == 1
    assert "no Snakemake log" in capsys.readouterr().err
