"""dprflow.plan.report: what the comparison and the report read, from the default config and edits
of it, without Snakemake (rules/evaluation.smk, rules/report.smk and the Snakefile's ``all``)."""

from __future__ import annotations

import json
from types import SimpleNamespace as W

import pytest
from config_edits import edited_config

from dprflow.config import reference_models
from dprflow.models.init import MLM_INIT
from dprflow.plan.models import ModelPlan
from dprflow.plan.report import ReportPlan, compare_results_dir, report_results_dir
from dprflow.plan.run_rows import RunRows


def plan(edit=None) -> ReportPlan:
    config = edited_config(edit)
    references = reference_models(config)
    models = ModelPlan(config, "results", references, config["model"]["init"] == MLM_INIT)
    return ReportPlan(config, "results", RunRows(config, list(references)), models, references)


def collection(p: ReportPlan) -> str:
    (name,) = p.rows.training_collections()
    return name


def test_every_trained_model_has_its_folders_and_the_recall_of_its_negatives():
    p = plan(lambda c: c.update(seeds=[13, 14]))
    c = collection(p)
    assert p.hub_folders() == [
        f"results/{c}/none/seed-{s}/{stage}/hub" for s in (13, 14) for stage in ("r1", "r2")
    ]
    assert p.nb_recall_files() == [f"results/{c}/none/seed-{s}/nb_recall.parquet" for s in (13, 14)]
    assert p.training_model_dirs() == [
        f"results/{c}/none/seed-{s}/{stage}/model" for s in (13, 14) for stage in ("r1", "r2")
    ]
    # retriever 1 alone: no recall of retriever 2's negatives to plot
    assert plan(lambda c: c["finetune"].update(stages=["r1"])).nb_recall_files() == []


def test_pre_training_folders_come_first_and_once():
    def edit(config):
        config["methods"] = ["condenser", "cocondenser", "bmae"]
        config["finetune"]["stages"] = ["r1"]

    p = plan(edit)
    c = collection(p)
    dirs = p.training_model_dirs()
    generic = "results/pretrain/condenser/generic/model"
    assert dirs.count(generic) == 1  # the Condenser's stage one, shared with coCondenser's
    assert dirs.index(generic) < dirs.index(f"results/{c}/condenser/seed-13/r1/model")
    assert f"results/{c}/cocondenser/pretrain/model" in dirs
    assert f"results/{c}/bmae/pretrain/model" in dirs and "results/pretrain/bmae/generic/model" in dirs
    assert p.pretrained_models(c, "ref-anything") == []  # a reference row has no pre-training
    mlm = plan(lambda config: (edit(config), config["model"].update(init="mlm")))
    assert mlm.training_model_dirs()[0] == "results/pretrain/mlm/model"


def test_the_comparison_reads_every_scored_row_and_orders_references_first():
    p = plan()
    c = collection(p)
    metrics = p.metrics_files()
    assert f"results/{c}/bm25/metrics.parquet" in metrics
    assert f"results/{c}/none/seed-13/r2/metrics.parquet" in metrics
    assert all(m.endswith("/metrics.parquet") for m in metrics)
    encoders = p.encoder_files()
    assert f"results/{c}/none/seed-13/r2/encoder.json" in encoders
    assert not any("/bm25/" in e for e in encoders)  # BM25 has no encoder
    assert p.row_order() == [*p.references, "none"]


def test_the_recorded_config_leaves_out_resource_settings_and_an_unused_mlm_section():
    recorded = json.loads(plan().config_json())
    assert "mlm" not in recorded["model"]  # model.init is not mlm
    # finetune.checkpoint_every, training.num_workers, training.log_every, bm25.heap_mb: they
    # change no result, and a param that held them would rerun the report
    assert "checkpoint_every" not in recorded["finetune"] and "log_every" not in recorded["training"]
    assert "heap_mb" not in recorded["bm25"] and "num_workers" not in recorded["training"]
    assert recorded["methods"] == ["none"] and "learning_rate" in recorded["finetune"]["retriever"]
    kept = json.loads(plan(lambda c: c["model"].update(init="mlm")).config_json())
    assert "mlm" in kept["model"]


def test_make_check_names_the_missing_expected_file():
    with pytest.raises(ValueError, match="evaluation.expected is not set"):
        plan(lambda c: c["evaluation"].update(expected=None)).expected_metrics_file()
    assert (
        plan(lambda c: c["evaluation"].update(expected="expected.yaml")).expected_metrics_file()
        == "expected.yaml"
    )


def test_the_results_folder_of_the_comparison_and_the_report():
    assert compare_results_dir(W(), W(md="results/compare.md")) == "results"
    assert report_results_dir(W(), W(html="results/report/index.html")) == "results"
