"""Transfer evaluation through Snakemake: an evaluate-only collection and a reference model,
planned on the tiny config and run after the finished tiny workflow (tests/tiny_workflow.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from tiny_workflow import TINY, planned_jobs, snakemake, tiny_st_model

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


def reference_folder(root: Path) -> Path:
    """A tiny sentence-transformers model (mean pooling, cosine) with query and passage prompts."""
    return tiny_st_model(root, {"query": "q: ", "passage": "p: "})


def transfer_config(base: Path, tmp_path: Path) -> Path:
    """The tiny config plus an evaluate-only collection (60 other documents, every query scored)
    and one reference model."""
    changed = yaml.safe_load(base.read_text())
    changed["collections"]["other"] = {
        "source": "embedded",
        "max_documents": 60,
        "split_percent": {"train": 0, "dev": 0, "test": 100},
        "evaluate_only": True,
    }
    changed.setdefault("model", {})["references"] = [str(reference_folder(tmp_path / "tiny-st"))]
    path = tmp_path / "transfer.yaml"
    path.write_text(yaml.safe_dump(changed))
    return path


def test_transfer_and_references_dag(tmp_path):
    """Dry run: nothing is trained on the evaluate-only collection; every trained row is encoded,
    searched and scored on it from the training collection's model; the reference row is scored
    on both collections with its own folder."""
    config = transfer_config(TINY, tmp_path)
    result = snakemake(tmp_path, config, "-n", "-p")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = planned_jobs(result)
    assert {
        k: jobs.get(k) for k in ("train_retriever", "bm25_negatives", "pretrain_corpus", "train_reranker")
    } == {
        # r1, r2, distill, the retriever's two grid points, the negatives' and the distillation's
        # one each, all on the training collection
        "train_retriever": 3 + 2 + 1 + 1,
        "bm25_negatives": 1,
        "pretrain_corpus": 1,
        "train_reranker": 1 + 1,  # and the reranker grid's point
    }
    # none/zeroshot and the reference on each collection; r1, r2, distill on the other
    assert jobs["search_eval"] == 2 * 2 + 3 and jobs["search_dense"] == 3 and jobs["rerank_transfer"] == 1
    # tiny: bm25, 2 off the shelf, 4 trained, 2 fused with BM25 (not transferred); other: bm25,
    # 2 off the shelf, 4 transferred
    assert jobs["evaluate"] == 7 + 2 + 7 and jobs["bm25_index"] == 2
    commands = [line.strip() for line in result.stdout.splitlines() if "dprflow.stages.encode_corpus" in line]
    transferred = [c for c in commands if "seed-13/r2/on-other/embeddings" in c]
    assert len(transferred) == 2  # two shards
    assert all(
        "--model results/tiny/cocondenser/seed-13/r2/model" in c
        and "--passages results/other/passages.parquet" in c
        for c in transferred
    )
    reference = [c for c in commands if "ref-tiny-st/zeroshot" in c]
    assert len(reference) == 4 and all(f"--model {tmp_path / 'tiny-st'}" in c for c in reference)
    assert "--untrained-rows bm25 none/zeroshot ref-tiny-st/zeroshot" in result.stdout


def test_transfer_end_to_end_scores_the_trained_rows_on_the_other_collection(finished_run, tmp_path):
    """After the tiny run, an evaluate-only collection and a reference model: retriever 2 is
    encoded, searched and scored on the other collection from the training collection's model,
    and the reference is encoded with its prompts, with no training. (The comparison's column
    groups and means: tests/test_passages_eval_compare.py; the whole plan:
    test_transfer_and_references_dag. Only these targets run, to keep the suite's time.)"""
    workdir, config = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    transferred = copy / "results" / "tiny" / "cocondenser" / "seed-13" / "r2" / "on-other"
    reference = copy / "results" / "other" / "ref-tiny-st" / "zeroshot"
    targets = [
        str((transferred / "metrics.parquet").relative_to(copy)),
        str((reference / "encoder.json").relative_to(copy)),
    ]
    result = snakemake(copy, transfer_config(config, tmp_path), *targets)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rule train_retriever" not in result.stdout + result.stderr
    assert "rule pretrain_" not in result.stdout + result.stderr
    metrics = pd.read_parquet(transferred / "metrics.parquet")
    ndcg = metrics[metrics["metric"] == "nDCG@10"]["value"]
    assert len(ndcg) > 0 and ndcg.between(0, 1).all()
    assert (transferred / "run.trec").exists()
    encoder = json.loads((reference / "encoder.json").read_text())
    assert encoder["prompts"] == {"query": "q: ", "passage": "p: "}
