"""The whole workflow through Snakemake on a tiny config: it runs, a second run does nothing,
changing a BM25 parameter reruns exactly what depends on it, and a bad config key stops the DAG.

The run starts from a 2-layer BERT of hidden size 32 with random weights, saved as a
sentence-transformers folder (mean pooling, cosine, as the packaged MiniLM), with the packaged
MiniLM tokenizer: every stage runs its real code on real tokens, and each training or encoding job
costs its start-up rather than MiniLM's arithmetic (the whole run: about 40 jobs). The packaged
model itself runs in `make run` and the stage tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.workflow

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TINY = ROOT / "tests" / "data" / "tiny_workflow.yaml"


def snakemake(workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        SNAKEMAKE,
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(config),
        "--cores",
        "2",
        *args,
    ]
    # Jobs run `python -m ...`: this interpreter's environment comes first, as in an activated venv.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # No timeout a slow machine reaches: on two busy cores the whole run takes a few minutes.
    return subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> job count."""
    jobs = {}
    if "Job stats" not in result.stdout:
        return jobs
    table = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    for line in table.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m and m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def tiny_st_model(root: Path, prompts: dict[str, str] | None = None) -> Path:
    """A tiny sentence-transformers model (mean pooling, cosine), with ``prompts`` if given."""
    from conftest import save_tiny_bert

    from dprflow.finetuning.st_format import ST_CONFIG_FILE, write_st_files

    save_tiny_bert(root, dropout=0.0, positions=512)  # the config's lengths checked as for BERT
    write_st_files(root, "mean", "cosine", dimension=32, max_seq_length=64)
    if prompts:
        config = json.loads((root / ST_CONFIG_FILE).read_text())
        (root / ST_CONFIG_FILE).write_text(json.dumps({**config, "prompts": prompts}))
    return root


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    config = yaml.safe_load(TINY.read_text())
    config["model"]["init"] = str(tiny_st_model(tmp_path_factory.mktemp("tiny-init")))
    config["finetune"]["encode_shards"] = 1
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    config = workdir / "config.yaml"
    result = snakemake(workdir, config)
    if result.returncode != 0:
        logs = "\n".join(
            f"== {p}\n{p.read_text()[-1500:]}" for p in (workdir / "results" / "logs").rglob("*.log")
        )
        pytest.fail(f"snakemake failed:\n{result.stderr[-4000:]}\n{logs[-6000:]}")
    return workdir, config


def test_the_comparison_has_every_row(finished_run):
    workdir, _ = finished_run
    table = pd.read_csv(workdir / "results" / "compare.csv")
    stages = ("r1", "r2", "rerank", "distill")
    expected = {"bm25", "none/zeroshot"} | {f"cocondenser/{s}" for s in stages}
    assert set(table["system"]) == expected
    assert set(table["metric"]) == {"RR@10", "R@50", "R@100", "nDCG@10"}
    assert table["value"].between(0, 1).all()
    assert (table["n_queries"] > 0).all()
    md = (workdir / "results" / "compare.md").read_text()
    assert "| bm25 | BM25 |" in md
    # MiniLM off the shelf as shipped; coCondenser's encoder in the papers' geometry.
    assert "| none/zeroshot | mean, cosine |" in md and "| cocondenser/r1 | cls, dot |" in md
    nb = pd.read_parquet(workdir / "results" / "tiny" / "cocondenser" / "seed-13" / "nb_recall.parquet")
    assert nb["k"].tolist() == [10, 50, 100] and nb["value"].is_monotonic_increasing
    # Trained models load as plain Hugging Face checkpoints.
    from transformers import AutoModel

    AutoModel.from_pretrained(workdir / "results" / "tiny" / "cocondenser" / "seed-13" / "r1" / "model")
    AutoModel.from_pretrained(workdir / "results" / "tiny" / "cocondenser" / "pretrain" / "model")


def test_trec_files_give_the_comparison_s_numbers(finished_run):
    """Every row's run.doc.trec with the collection's qrels.test.trec, read by ir_measures, gives
    compare.csv's nDCG@10 and RR@10 to 1e-4 (ranx reads the same files in
    test_passages_eval_compare.py)."""
    import ir_measures

    workdir, _ = finished_run
    results = workdir / "results"
    table = pd.read_csv(results / "compare.csv").set_index(["system", "metric"])["value"]
    qrels_file = results / "tiny" / "collection" / "qrels.test.trec"
    qrels = list(ir_measures.read_trec_qrels(str(qrels_file)))
    runs = sorted((results / "tiny").glob("**/run.doc.trec"))
    rows = {str(p.parent.relative_to(results / "tiny")).replace("seed-13/", ""): p for p in runs}
    assert set(rows) == set(table.index.get_level_values(0))
    measures = [ir_measures.parse_measure(m) for m in ("nDCG@10", "RR@10")]
    for system, path in rows.items():
        theirs = ir_measures.calc_aggregate(measures, qrels, list(ir_measures.read_trec_run(str(path))))
        for measure, value in theirs.items():
            assert value == pytest.approx(table[(system, str(measure))], abs=1e-4), (system, measure)


def test_a_second_seed_reruns_the_fine_tuning_pipeline_only(finished_run, tmp_path):
    """seeds: [13, 14] after a run of seed 13: seed 14's fine-tuning jobs, sharing the pre-trained
    encoder, BM25 and the zeroshot row; the comparison and report follow."""
    workdir, config = finished_run
    changed = yaml.safe_load(config.read_text())
    changed["seeds"] = [13, 14]
    changed_path = tmp_path / "seeds.yaml"
    changed_path.write_text(yaml.safe_dump(changed))
    result = snakemake(workdir, changed_path, "-n", "-p")
    jobs = planned_jobs(result)
    assert jobs == {
        "train_retriever": 3,
        "mine_negatives": 2,
        "train_reranker": 1,
        "rerank": 1,
        "score_candidates": 1,
        "encode_corpus": 3,  # one shard each
        "search_dense": 3,
        "evaluate": 4,
        "nb_recall": 1,
        "compare": 1,
        "export_model": 8,  # the comparison changes: every row's card, both seeds
        "report_results": 1,
        "all": 1,
    }, jobs
    assert "--seed 14" in result.stdout and "--seed 13" not in result.stdout
    assert "results/tiny/cocondenser/seed-14/r1/model" in result.stdout


def test_second_run_does_nothing(finished_run):
    workdir, config = finished_run
    result = snakemake(workdir, config, "-n")
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr


def test_changing_the_bm25_heap_reruns_nothing_but_the_report(finished_run, tmp_path):
    """bm25.heap_mb bounds the JVM's memory and changes no output: a job resource, not a param.
    Only the report, which records the whole config, is written again."""
    workdir, config = finished_run
    changed = yaml.safe_load(config.read_text())
    changed.setdefault("bm25", {})["heap_mb"] = 1024
    changed_path = tmp_path / "changed.yaml"
    changed_path.write_text(yaml.safe_dump(changed))
    jobs = planned_jobs(snakemake(workdir, changed_path, "-n"))
    assert set(jobs) - {"all"} == {"report_results"}, jobs


def test_changing_bm25_k1_reruns_only_what_depends_on_it(finished_run, tmp_path):
    workdir, config = finished_run
    changed = yaml.safe_load(config.read_text())
    changed["bm25"]["k1"] = 1.2
    changed_path = tmp_path / "changed.yaml"
    changed_path.write_text(yaml.safe_dump(changed))
    jobs = planned_jobs(snakemake(workdir, changed_path, "-n"))
    for untouched in ("ingest", "split_passages", "bm25_index"):
        assert untouched not in jobs, jobs
    assert jobs["bm25_search"] == 1 and jobs["bm25_negatives"] == 1
    # pre-training does not read BM25: untouched
    assert "pretrain_generic" not in jobs and "pretrain_corpus" not in jobs
    # r1, r2, distill and the reranker
    assert jobs["train_retriever"] == 3 and jobs["train_reranker"] == 1
    # every evaluated row but the off-the-shelf model's
    assert jobs["evaluate"] == 5
    assert jobs["encode_corpus"] == 3  # r1, r2, distill; one shard each; zeroshot untouched


def test_unknown_config_key_stops_the_dag_and_names_it(tmp_path):
    bad = yaml.safe_load(TINY.read_text())
    bad["finetune"]["retriever"]["lr"] = 1e-5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = snakemake(tmp_path, path, "-n")
    assert result.returncode != 0
    assert "unknown config key(s) ['lr'] at finetune.retriever; allowed:" in result.stderr + result.stdout


def test_report_pieces_render_and_the_snakemake_report_builds(finished_run):
    import numpy as np
    from matplotlib.image import imread

    workdir, config = finished_run
    report_dir = workdir / "results" / "report"
    for figure in ("training_loss.png", "nb_recall.png", "main_metric.png"):
        image = imread(report_dir / figure)
        assert image.shape[0] > 100 and float(np.std(image[..., :3])) > 0.01, figure  # not blank
    page = (report_dir / "comparison.html").read_text()
    assert "<th>system</th>" in page and "<td>cocondenser/r2</td>" in page
    assert "<h3>tiny cocondenser/r2</h3>" in page and "train_retriever" in page
    result = snakemake(workdir, config, "--report", str(workdir / "report.html"))
    assert result.returncode == 0, result.stderr[-3000:]
    html = (workdir / "report.html").read_text(errors="replace")
    assert len(html) > 10_000 and "main_metric.png" in html and "comparison.html" in html
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("no headless browser for the render check (make render-check installs chromium)")
    rendered = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_report_render.py"), "--results",
         str(workdir / "results"), "--report", str(workdir / "report.html")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert "OK   snakemake report lists its items" in rendered.stdout


def test_every_stage_output_has_a_provenance_record(finished_run):
    workdir, _ = finished_run
    tiny = workdir / "results" / "tiny"
    seed = tiny / "cocondenser" / "seed-13"
    record = json.loads((seed / "r2" / "metrics.parquet.provenance.json").read_text())
    assert record["stage"] == "evaluate" and record["code"]["commit"]
    assert str(Path("results/tiny/cocondenser/seed-13/r2/run.parquet")) in record["inputs"]
    assert (seed / "r1" / "model" / "provenance.json").is_file()
    assert (tiny / "passages.parquet.provenance.json").is_file()


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
        "train_retriever": 3,
        "bm25_negatives": 1,
        "pretrain_corpus": 1,
        "train_reranker": 1,
    }
    # none/zeroshot and the reference on each collection; r1, r2, distill on the other
    assert jobs["search_eval"] == 2 * 2 + 3 and jobs["search_dense"] == 3 and jobs["rerank_transfer"] == 1
    # tiny: bm25, 2 off the shelf, 4 trained; other: bm25, 2 off the shelf, 4 transferred
    assert jobs["evaluate"] == 7 + 7 and jobs["bm25_index"] == 2
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
