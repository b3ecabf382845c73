"""Runs that change the finished tiny workflow (tests/tiny_workflow.py), each on a copy of it:
one value changed reruns exactly what is downstream (provenance records), more encoding shards
retrain nothing, and inputs rewritten with the same bytes rerun nothing."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml
from snakemake.cli import parse_size_in_bytes
from tiny_workflow import ROOT, planned_jobs, snakemake

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


def provenance_records(results: Path) -> dict[str, str]:
    return {
        str(p.relative_to(results)): p.read_text()
        for p in results.rglob("*")
        if p.name.endswith(".provenance.json") or p.name == "provenance.json"
    }


def test_changing_one_value_changes_the_provenance_of_exactly_what_is_downstream(finished_run, tmp_path):
    """The distillation weight alpha: the distilled retriever, its embeddings, run and evaluation
    get new records, as do the comparison and every row's hub export (its card carries the
    comparison's metrics); everything upstream (BM25, pre-training, r1, r2, the reranker) keeps its."""
    workdir, config = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    before = provenance_records(copy / "results")
    changed = yaml.safe_load(config.read_text())
    changed["finetune"]["distill"]["alpha"] = 0.5
    changed_path = tmp_path / "changed.yaml"
    changed_path.write_text(yaml.safe_dump(changed))
    result = snakemake(copy, changed_path)
    assert result.returncode == 0, result.stderr[-3000:]
    after = provenance_records(copy / "results")
    assert set(before) == set(after)
    moved = {k for k in before if before[k] != after[k]}
    downstream = ("tiny/cocondenser/seed-13/distill/", "compare.", "report/")
    # every row's hub export too: its card carries the comparison's metrics (export_model)
    assert moved == {k for k in before if k.startswith(downstream) or "/hub/" in k}
    assert any(k.startswith("tiny/cocondenser/seed-13/distill/model") for k in moved)
    assert any(k.startswith("tiny/cocondenser/seed-13/distill/embeddings") for k in moved)


def test_more_encoding_shards_retrain_nothing(finished_run, tmp_path):
    """finetune.encode_shards 1 -> 2, run up to retriever 2: retriever 1's corpus is encoded and
    searched again (the shard files are other files), every passage in the same batch as before,
    so its search and the negatives mined from it come out byte for byte the same, and the
    retriever 2 job Snakemake reruns on them puts its finished model back instead of training."""
    workdir, config = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    trained = copy / "results" / "tiny" / "cocondenser" / "seed-13"
    kept = [trained / "r1" / "train_run.parquet", trained / "r1" / "negatives.parquet"]
    kept.append(trained / "r2" / "model" / "model.safetensors")
    before = {p: p.read_bytes() for p in kept}
    changed = yaml.safe_load(config.read_text())
    changed["finetune"]["encode_shards"] = 2
    changed_path = tmp_path / "shards.yaml"
    changed_path.write_text(yaml.safe_dump(changed))
    result = snakemake(copy, changed_path, str(trained.relative_to(copy) / "r2" / "model"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (trained / "r1" / "embeddings" / "shard_1.parquet").exists()
    assert "train_retriever" in result.stderr  # rerun by Snakemake ...
    log = copy / "results" / "logs" / "tiny" / "cocondenser" / "seed-13" / "train_retriever_r2.log"
    text = log.read_text()
    assert "reused the model this stage finished" in text and "step 1/" not in text  # ... not trained
    assert {p: p.read_bytes() for p in kept} == before


def test_inputs_with_new_times_and_the_same_bytes_rerun_nothing(finished_run, tmp_path):
    """A collection copied or unpacked again has new modification times and the same bytes. With
    the profiles' --max-checksum-file-size, Snakemake compares each such input's SHA-256 with the
    one it recorded and reruns nothing; with checksums off (0) it reruns everything downstream."""
    workdir, config = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    later = time.time() + 60
    for p in (copy / "results" / "tiny" / "collection").iterdir():
        os.utime(p, (later, later))
    threshold = {}
    for profile in ("local", "slurm", "slurm-ci"):
        settings = yaml.safe_load((ROOT / "profiles" / profile / "config.yaml").read_text())
        threshold[profile] = parse_size_in_bytes(settings["max-checksum-file-size"])
    # SciFact's corpus is 7.8 MB, MS MARCO's passages 3.1 GB: the default (1 MB) covers neither.
    assert all(size >= 4 * 10**9 for size in threshold.values()), threshold
    same = snakemake(copy, config, "-n", "--max-checksum-file-size", str(threshold["local"]))
    assert same.returncode == 0, same.stderr[-3000:]
    assert planned_jobs(same) == {}, same.stdout[-3000:]
    off = snakemake(copy, config, "-n", "--max-checksum-file-size", "0")
    assert off.returncode == 0, off.stderr[-3000:]
    rerun = set(planned_jobs(off))
    assert {"split_passages", "train_retriever", "encode_corpus"} <= rerun, off.stdout[-3000:]
