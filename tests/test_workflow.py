"""The whole workflow through Snakemake on a tiny config (tests/tiny_workflow.py): it runs, a
second run does nothing, changing a BM25 parameter or the seeds reruns exactly what depends on it,
the report builds, and a bad config key stops the DAG. Runs that change the finished workflow:
tests/test_workflow_reruns.py; transfer to another collection: tests/test_workflow_transfer.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from tiny_workflow import ROOT, TINY, planned_jobs, snakemake

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


def test_the_comparison_has_every_row(finished_run):
    workdir, _ = finished_run
    table = pd.read_csv(workdir / "results" / "compare.csv")
    stages = ("r1", "r2", "rerank", "distill")
    expected = {"bm25", "none/zeroshot"} | {f"cocondenser/{s}" for s in stages}
    fused = {"none/zeroshot+bm25", "cocondenser/r2+bm25"}  # finetune.fusion.rows
    assert set(table["system"]) == expected | fused
    assert set(table["metric"]) == {"RR@10", "R@50", "R@100", "nDCG@10"}
    assert table["value"].between(0, 1).all()
    assert (table["n_queries"] > 0).all()
    md = (workdir / "results" / "compare.md").read_text()
    assert "| bm25 | BM25 |" in md
    # MiniLM off the shelf as shipped; coCondenser's encoder in the papers' geometry.
    assert "| none/zeroshot | mean, cosine |" in md and "| cocondenser/r1 | cls, dot |" in md
    assert "| cocondenser/r2+bm25 | fused with BM25 |" in md
    # The grid's choice on held-out training queries: in the table's notes, and r1 trained with it.
    seed = workdir / "results" / "tiny" / "cocondenser" / "seed-13"
    selection = json.loads((seed / "select" / "selection.json").read_text())
    points = {p["point"]: p["value"] for p in selection["retriever"]["points"]}
    assert set(points) == {"learning_rate=2e-05", "learning_rate=0.001"}
    assert selection["retriever"]["best"] == max(points, key=points.get)
    # the fused row's weight, chosen in a job of its own with the chosen point's held-out run
    fusion = json.loads((seed / "select" / "fusion.json").read_text())
    assert 0.1 <= fusion["weight"] <= 0.9
    assert fusion["dense_run"].endswith(f"select/{selection['retriever']['best']}/heldout/run.parquet")
    assert "| retriever settings | " in md and f"| {selection['retriever']['best']} (by " in md
    log = (
        workdir / "results" / "logs" / "tiny" / "cocondenser" / "seed-13" / "train_retriever_r1.log"
    ).read_text()
    assert f"settings chosen on held-out queries ({seed.relative_to(workdir)}/select/selection.json)" in log
    args = json.loads(log.split("train_retriever arguments: ", 1)[1].splitlines()[0])
    assert args["split"] == "train" and args["selection"]
    # the later grids (one point each here): r2 drew BM25's share of the negatives' grid, the
    # distilled row trained with its grid's alpha, from a teacher trained on the fit part
    logs = workdir / "results" / "logs" / "tiny" / "cocondenser" / "seed-13"
    negatives = json.loads((seed / "select" / "r2" / "selection.json").read_text())["negatives"]
    assert negatives["best"] == "r2_bm25_fraction=0.5" and 0 <= negatives["points"][0]["value"] <= 1
    r2_log = (logs / "train_retriever_r2.log").read_text()
    assert (
        len(json.loads(r2_log.split("train_retriever arguments: ", 1)[1].splitlines()[0])["selection"]) == 2
    )
    assert "'r2_bm25_fraction': 0.5" in r2_log
    distill = json.loads((seed / "select" / "distill" / "selection.json").read_text())["distill"]
    assert distill["settings"] == {"alpha": 0.5}
    assert "'alpha': 0.5" in (logs / "train_retriever_distill.log").read_text()
    teacher = (logs / "select" / "rerank" / "score_candidates.log").read_text()
    assert "teacher results/tiny/cocondenser/seed-13/select/rerank/learning_rate=0.001/model" in teacher
    # the reranker's grid: its point reranked BM25's held-out run; the row trained with its settings
    reranker = json.loads((seed / "select" / "rerank" / "selection.json").read_text())["reranker"]
    assert reranker["best"] == "learning_rate=0.001" and 0 <= reranker["first_stage"] <= 1
    assert "'learning_rate': 0.001" in (logs / "rerank" / "train_reranker.log").read_text()
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
        # r1, r2, distill, and seed 14's own points: two of the retriever's grid, one of the
        # negatives' (r2 on the fit part), one of the distillation's
        "train_retriever": 3 + 2 + 1 + 1,
        "mine_negatives": 2 + 1,  # and the fit part's pool, from the chosen point's fit run
        "train_reranker": 1 + 1,  # and the reranker grid's point of seed 14
        "rerank": 1 + 1,
        "score_candidates": 1 + 1,  # and the fit part's, by the chosen reranker point
        "encode_corpus": 3 + 2 + 1 + 1,  # one shard each
        "search_dense": 3,
        # the retriever points' held-out and fit parts; the r2 and distillation points' held-out
        "search_heldout": 2 + 2 + 1 + 1,
        "evaluate_heldout": 2 + 1 + 1 + 1,  # BM25's held-out run is scored once, for both seeds
        "select_settings": 4,
        "select_fusion": 1,  # seed 14's weight (none/zeroshot's is shared)
        "fuse": 1,  # r2+bm25 of seed 14 (none/zeroshot+bm25 is shared)
        "evaluate": 4 + 1,
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


def test_changing_the_bm25_heap_reruns_nothing(finished_run, tmp_path):
    """bm25.heap_mb bounds the JVM's memory and changes no output: a job resource, not a param,
    and left out of the config the report records (dprflow.rule_flags.RESOURCE_SETTINGS)."""
    workdir, config = finished_run
    changed = yaml.safe_load(config.read_text())
    changed.setdefault("bm25", {})["heap_mb"] = 1024
    changed_path = tmp_path / "changed.yaml"
    changed_path.write_text(yaml.safe_dump(changed))
    result = snakemake(workdir, changed_path, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result) == {} and "Nothing to be done" in result.stdout + result.stderr


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
    # r1, r2, distill, the two grid points (on BM25 negatives), the negatives' point (r2 on the fit
    # part, BM25's pool beside the mined one), the distillation's (from a teacher trained on BM25
    # negatives) and the reranker with the point of its grid (also on BM25 negatives)
    assert jobs["train_retriever"] == 3 + 2 + 1 + 1 and jobs["train_reranker"] == 1 + 1
    # every evaluated row but the off-the-shelf model's (both fused rows read BM25's run)
    assert jobs["evaluate"] == 5 + 2
    # r1, r2, distill and the four grid points; one shard each; zeroshot untouched
    assert jobs["encode_corpus"] == 3 + 2 + 1 + 1


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
