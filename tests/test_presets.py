"""The paper-scale presets build their whole DAG (a dry run) without any data.

A dry run lists jobs only; it never runs ingest, so MS MARCO is not downloaded (checked with an
empty IR_DATASETS_HOME). A *source* input that no rule produces must exist even in a dry run
(Snakemake raises MissingInputException for it), so the generic pre-training corpus, which the
user provides, is stood in for by an empty file.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
import yaml
from snakemake_cli import snakemake as run_snakemake

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PRESETS = sorted((ROOT / "config" / "presets").glob("*.yaml"))


def test_there_are_presets():
    assert {p.stem for p in PRESETS} >= {"msmarco-cocondenser", "msmarco-cdmae"}


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_dry_run_lists_the_whole_dag(preset, tmp_path):
    config = yaml.safe_load(preset.read_text())
    corpus = config["pretrain"].get("generic_corpus", {})
    if corpus.get("path"):
        # The user's Wikipedia + BookCorpus file: relative paths resolve in --directory.
        stand_in = tmp_path / corpus["path"]
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.touch()
    irds_home = tmp_path / "ir_datasets_home"
    env = {**os.environ, "IR_DATASETS_HOME": str(irds_home)}
    started = time.monotonic()
    result = run_snakemake(
        [
            SNAKEMAKE,
            "-n",
            "-s",
            str(ROOT / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(preset),
        ],
        cwd=ROOT,
        env=env,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    total = re.search(r"^total\s+(\d+)$", result.stdout, flags=re.MULTILINE)
    assert total, result.stdout[-2000:]
    print(f"{preset.stem}: {total.group(1)} jobs, dry run {elapsed:.1f}s")
    # Nothing was downloaded or written: no MS MARCO, no results.
    assert not irds_home.exists() or not any(irds_home.iterdir())
    assert not (tmp_path / "results").exists()
    # Cluster requests follow the config's sizes: a paper-scale encoding shard and flat index ask
    # for far more than the default run's (3,000-3,500 MB).
    requests = job_resources(result.stdout)
    assert requests["encode_corpus"]["mem_mb"] > 5_000 and requests["search_dense"]["mem_mb"] > 30_000
    assert requests["train_retriever"]["runtime"] > 60


def job_resources(dry_run: str) -> dict[str, dict[str, int]]:
    """The largest mem_mb and runtime a dry run lists per rule."""
    out: dict[str, dict[str, int]] = {}
    for block in dry_run.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0].strip()
        line = next((x for x in block.splitlines() if x.strip().startswith("resources:")), "")
        for key in ("mem_mb", "runtime"):
            m = re.search(rf"\b{key}=(\d+)", line)
            if m:
                out.setdefault(rule, {}).setdefault(key, 0)
                out[rule][key] = max(out[rule][key], int(m.group(1)))
    return out
