"""Issue 22: no config value runs as a command. Every setting that reaches a shell line, set to a
value that would run `touch <marker>` if a shell read it unquoted, arrives as one argument,
unchanged, in every planned job and in a real run; the rules quote every value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from dry_runs import DRY_RUN
from local_inputs import beir_folder, model_folder
from snakemake_cli import snakemake as run_snakemake

ROOT = Path(__file__).resolve().parents[1]

# Each value would run `touch <marker>` if a shell line took it unquoted: $(...), backticks, ';'
# and '|' (no braces: Snakemake reads those as wildcards in input paths).
INJECTED = {
    "init": "m$(touch INJ-init)`touch INJ-init2`",
    "reranker": "r;touch INJ-reranker",
    "doc2query": "d|touch INJ-doc2query",
    "collection": "c$(touch INJ-collection) x",
    "corpus": "g`touch INJ-corpus`.jsonl",
}
IRDS_IDS = {"train": "x$(touch INJ-irds-train)", "test": "y`touch INJ-irds-test`"}
METRIC = "P(rel=2)@10"


def markers(*folders: Path) -> list[Path]:
    return [m for folder in folders for m in folder.rglob("INJ-*")]


def injected_config(tmp_path: Path) -> dict:
    """all-methods.yaml (every rule) with each setting that reaches a shell line set to a value
    that would run a command: model folders, a BEIR path, a generic corpus file, ir_datasets ids and a
    parameterised metric."""
    import yaml

    config = yaml.safe_load((ROOT / "config" / "examples" / "all-methods.yaml").read_text())
    config["model"]["init"] = str(model_folder(tmp_path / INJECTED["init"]))
    config["finetune"]["reranker"]["init"] = str(model_folder(tmp_path / INJECTED["reranker"]))
    config["pretrain"]["doc2query"]["model"] = str(model_folder(tmp_path / INJECTED["doc2query"]))
    corpus = tmp_path / INJECTED["corpus"]
    corpus.write_text('{"text": "A generic document about flow."}\n')
    config["pretrain"]["generic_corpus"] = {"source": "jsonl", "path": str(corpus)}
    beir = beir_folder(tmp_path / INJECTED["collection"])
    config["collections"] = {
        "c1": {"source": "beir", "path": str(beir), "eval_split": "test", "train_split": "train"},
        "c2": {
            "source": "ir_datasets",
            "ir_datasets": IRDS_IDS,
            "eval_split": "test",
            "train_split": "train",
        },
    }
    config["evaluation"]["metrics"] = [METRIC, "nDCG@10"]
    return config


@pytest.mark.slow
def test_no_config_value_runs_as_a_command_in_any_planned_shell_line(tmp_path):
    """Every job of every method planned with injected values, its shell line run by bash with
    `python` and `torchrun` recording their arguments: no marker appears, and each value arrives
    as one argument, unchanged."""
    import shlex

    import yaml

    data, work, bin_dir = tmp_path / "data", tmp_path / "work", tmp_path / "bin"
    for d in (data, work, bin_dir):
        d.mkdir()
    config = injected_config(data)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    cmd = [DRY_RUN[0], "-n", "-p", "-s", str(ROOT / "Snakefile"), "--configfile", str(tmp_path / "c.yaml")]
    out = run_snakemake([*cmd, "-d", str(work)])
    assert out.returncode == 0, out.stderr[-3000:]
    prefix = "Shell command: "
    lines = [line[len(prefix) :] for line in out.stdout.splitlines() if line.startswith(prefix)]
    lines = [line for line in lines if line != "None"]  # rules without a shell line (all)
    assert len(lines) > 150, out.stdout[-2000:]
    argv_log = tmp_path / "argv.txt"
    for name in ("python", "torchrun"):
        stub = bin_dir / name
        stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a" >> "$ARGV_LOG"; done\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ARGV_LOG": str(argv_log)}
    for line in lines:
        for token in shlex.split(line):
            if token.startswith("results/"):
                (work / token).parent.mkdir(parents=True, exist_ok=True)
        ran = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True)
        assert ran.returncode == 0, (line, ran.stderr)
    assert markers(tmp_path, ROOT) == []
    args = argv_log.read_text().splitlines()
    for value in (
        config["model"]["init"],
        config["finetune"]["reranker"]["init"],
        config["pretrain"]["doc2query"]["model"],
        config["pretrain"]["generic_corpus"]["path"],
        METRIC,
    ):
        assert value in args, value
    import json

    assert str(data / INJECTED["collection"]) in args  # ingest's --path
    assert IRDS_IDS in [json.loads(a) for a in args if a.startswith("{")]  # ingest's --ir-datasets


@pytest.mark.slow
def test_a_real_run_with_injected_values_creates_no_marker_and_scores_a_parameterised_metric(tmp_path):
    """ingest, split_passages, BM25 and evaluate run for real on a BEIR folder and a model folder
    whose names would run commands, scoring P(rel=2)@10 (a metric whose name the shell would read
    as a subshell): no marker, and the metric's values are ir_measures' own."""
    import ir_measures
    import yaml

    data, work = tmp_path / "data", tmp_path / "work"
    data.mkdir()
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["model"]["init"] = str(model_folder(data / INJECTED["init"]))
    beir = beir_folder(data / INJECTED["collection"])
    config["collections"] = {
        "c1": {"source": "beir", "path": str(beir), "eval_split": "test", "train_split": "train"}
    }
    config["evaluation"]["metrics"] = [METRIC, "nDCG@10"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    cmd = [DRY_RUN[0], "-s", str(ROOT / "Snakefile"), "--configfile", str(tmp_path / "c.yaml"), "-c1"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    target = "results/c1/bm25/metrics.parquet"
    out = subprocess.run(
        [*cmd, "-d", str(work), target], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert markers(tmp_path, ROOT) == []
    metrics = pd.read_parquet(work / target)
    run = pd.read_parquet(work / "results/c1/bm25/run.parquet")
    run["doc_id"] = run["passage_id"].str.split("#").str[0]
    run = run.groupby(["query_id", "doc_id"], as_index=False)["score"].max()
    qrels = pd.DataFrame(
        {"query_id": ["q3", "q3", "q4"], "doc_id": ["d3", "d2", "d4"], "relevance": [2, 1, 2]}
    )
    expected = {
        m.query_id: m.value for m in ir_measures.iter_calc([ir_measures.parse_measure(METRIC)], qrels, run)
    }
    got = metrics[metrics["metric"] == METRIC].set_index("query_id")["value"].to_dict()
    assert expected and {q: got[q] for q in expected} == pytest.approx(expected)


def test_shell_lines_in_the_rules_quote_every_value():
    """The same rule as the before-stop check: a shell line's {params.x}, {input.x}, {output.x},
    {wildcards.x} or {log} is quoted with :q, except flag strings built from quoted values."""
    import re

    unquoted = []
    for path in sorted((ROOT / "rules").glob("*.smk")):
        in_shell = False
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            stripped = line.strip()
            if stripped == "shell:":
                in_shell = True
                continue
            if in_shell and not stripped.startswith('"'):
                in_shell = False
            if in_shell:
                for m in re.finditer(r"\{(params|input|output|wildcards|log)(\.\w+)?\}", line):
                    if m.group(0) not in ("{params.flags}", "{params.launch}"):
                        unquoted.append(f"{path.name}:{number}: {m.group(0)}")
    assert unquoted == []
