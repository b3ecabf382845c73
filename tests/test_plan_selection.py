"""dprflow.plan.selection: what the selection's and the fused rows' jobs read, and their flags."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace as W

import pytest

from dprflow.plan.run_rows import RunRows
from dprflow.plan.selection import SelectionPlan

POINTS = {"learning_rate=2e-05": {"learning_rate": 2e-5}, "learning_rate=5e-05": {"learning_rate": 5e-5}}


def plan(
    grid=True,
    method="convex",
    fused=("zeroshot", "r2"),
    seeds=(),
    stages=("r1", "r2"),
    negatives=False,
    per_seed=True,
    methods=("none",),
    by=None,
    seeds_of=None,
) -> SelectionPlan:
    config = {
        "collections": {"docs": {"evaluate_only": False, "evaluate_on": []}},
        "methods": list(methods),
        "seeds": list(seeds),
        "seeds_of": seeds_of or {},
        "finetune": {
            "seed": 13,
            "stages": list(stages),
            "stages_of": {},
            "search_depth": 100,
            "mining_depth": 200,
            "select": {
                "retriever": {"learning_rate": [2e-5, 5e-5]} if grid else {},
                "reranker": {"epochs": [1, 3]},
                "metric": "nDCG@10",
                "per_seed": per_seed,
                "by": by,
            },
            "fusion": {
                "method": method,
                "rows": list(fused),
                "weights": [0.5, 0.7],
                "normalizations": ["theoretical", "minmax"],
                "rrf_k": 60,
            },
        },
    }
    rows = RunRows(config, [])
    points = POINTS if grid else {"configured": {}}
    grids = {
        "retriever": points,
        "reranker": RERANKER_POINTS,
        "negatives": NEGATIVES_POINTS if negatives else {},
    }
    return SelectionPlan(config, "results", rows, grids)


RERANKER_POINTS = {"epochs=1": {"epochs": 1}, "epochs=3": {"epochs": 3}}
NEGATIVES_POINTS = {
    "r2_bm25_fraction=0": {"r2_bm25_fraction": 0.0},
    "r2_bm25_fraction=0.5": {"r2_bm25_fraction": 0.5},
}


def test_a_negatives_point_is_retriever_2_on_the_fit_part_from_the_chosen_point_s_pool():
    p = plan(negatives=True)
    point = W(collection="docs", method="none", seed="13", trained="select/r2/r2_bm25_fraction=0.5")
    assert p.is_negatives_point(point) and not p.is_point(point) and p.trains_on_fit(point)
    assert p.negatives_point_settings(point) == {"r2_bm25_fraction": 0.5}
    assert p.training_queries(point) == "results/docs/collection/heldout_queries.parquet"
    assert p.fit_negatives(point) == "results/docs/none/seed-13/select/negatives.parquet"
    assert p.selection_file(point) == ["results/docs/none/seed-13/select/selection.json"]
    r2 = W(collection="docs", method="none", seed="13", trained="r2")
    assert p.selection_file(r2)[1] == "results/docs/none/seed-13/select/r2/selection.json"
    pool = W(collection="docs", method="none", seed="13", trained="select")
    assert p.mined_runs(pool) == [f"results/docs/none/seed-13/select/{n}/fit/run.parquet" for n in POINTS]
    assert p.mining_flags(pool) == " --selection results/docs/none/seed-13/select/selection.json"
    r1 = W(collection="docs", method="none", seed="13", trained="r1")
    assert p.mined_runs(r1) == ["results/docs/none/seed-13/r1/train_run.parquet"] and p.mining_flags(r1) == ""
    assert p.part_depth(W(part="fit")) == 200 and p.part_depth(W(part="heldout")) == 100
    # an empty retriever grid: one point's fit run, nothing to choose among
    assert plan(grid=False, negatives=True).mining_flags(pool) == ""
    assert "select/r2/selection.json" in " ".join(p.selection_files())


def test_a_reranker_point_trains_on_the_fit_part_s_bm25_negatives_and_the_row_reads_its_choice():
    p = plan(stages=("r1", "r2", "rerank"))
    point = W(collection="docs", method="none", seed="13", reranker="select/rerank/epochs=3")
    assert p.is_reranker_point(point) and p.reranker_point_settings(point) == {"epochs": 3}
    assert p.reranker_training(point) == {
        "queries": "results/docs/collection/heldout_queries.parquet",
        "negatives": "results/docs/bm25/negatives.parquet",
    }
    assert p.reranker_selection_flag(point) == ""
    assert p.reranked_inputs(
        W(collection="docs", method="none", seed="13", reranked="select/rerank/epochs=3/heldout")
    ) == {
        "model": "results/docs/none/seed-13/select/rerank/epochs=3/model",
        "run": "results/docs/bm25/heldout/run.parquet",
        "queries": "results/docs/collection/heldout_queries.parquet",
    }
    row = W(collection="docs", method="none", seed="13", reranker="rerank", reranked="rerank")
    chosen = "results/docs/none/seed-13/select/rerank/selection.json"
    assert p.reranker_point_settings(row) == {} and p.reranker_training(row)["selection"] == chosen
    assert p.reranker_training(row)["negatives"] == "results/docs/none/seed-13/r2/negatives.parquet"
    assert p.reranker_selection_flag(row) == f" --selection {chosen}"
    assert p.reranked_inputs(row)["run"] == "results/docs/none/seed-13/r2/run.parquet"
    assert chosen in p.selection_files()
    chooser = W(collection="docs", method="none", chooser="seed-13/select/rerank")
    assert p.chooser_inputs(chooser)["first_stage"] == "results/docs/bm25/heldout/metrics.parquet"
    assert "--section reranker" in p.chooser_flags(chooser)
    with pytest.raises(ValueError, match="'epochs=9' is not a point of finetune.select.reranker's grid"):
        p.reranker_point_settings(W(reranker="select/rerank/epochs=9"))
    # no reranker among the stages: the grid chooses nothing
    quiet = plan()
    assert not quiet.selects_reranker("none") and chosen not in quiet.selection_files()
    assert "selection" not in quiet.reranker_training(row)


def test_r1_and_r2_read_their_seed_s_selection_only_when_a_grid_chooses():
    r2 = W(collection="docs", method="none", seed="13", trained="r2")
    assert plan().selection_file(r2) == ["results/docs/none/seed-13/select/selection.json"]
    assert plan().selection_flag(r2) == " --selection results/docs/none/seed-13/select/selection.json"
    assert plan(grid=False).selection_file(r2) == [] and plan(grid=False).selection_flag(r2) == ""
    distill = W(collection="docs", method="none", seed="13", trained="distill")
    assert plan().selection_file(distill) == []


def test_a_grid_point_trains_on_the_fit_part_with_its_settings():
    point = W(collection="docs", method="none", seed="13", trained="select/learning_rate=5e-05")
    p = plan()
    assert p.is_point(point) and p.point_settings(point) == {"learning_rate": 5e-5}
    assert p.training_queries(point) == "results/docs/collection/heldout_queries.parquet"
    r1 = W(collection="docs", method="none", seed="13", trained="r1")
    assert not p.is_point(r1) and p.training_queries(r1) == "results/docs/collection/queries.parquet"
    unknown = W(collection="docs", method="none", seed="13", trained="select/epochs=9")
    with pytest.raises(ValueError, match="'epochs=9' is not a point .*learning_rate=2e-05"):
        p.point_settings(unknown)


def test_the_settings_are_chosen_from_every_point_s_held_out_metrics_in_grid_order():
    chooser = W(collection="docs", method="none", chooser="seed-13/select")
    assert plan().chooser_inputs(chooser) == {
        "metrics": [f"results/docs/none/seed-13/select/{p}/heldout/metrics.parquet" for p in POINTS]
    }
    flags = shlex.split(plan().chooser_flags(chooser))
    assert json.loads(flags[flags.index("--grid") + 1]) == list(POINTS.values())
    assert "--weights" not in flags and "--bm25-run" not in flags  # the weight: select_fusion's


def test_a_weight_is_chosen_with_the_chosen_point_s_run_or_the_model_off_the_shelf_s():
    chooser = W(collection="docs", method="none", chooser="seed-13/select")
    inputs = plan().fusion_chooser_inputs(chooser)
    assert inputs["runs"] == [f"results/docs/none/seed-13/select/{p}/heldout/run.parquet" for p in POINTS]
    assert inputs["selection"] == "results/docs/none/seed-13/select/selection.json"
    assert inputs["bm25"] == "results/docs/bm25/heldout/run.parquet"
    flags = shlex.split(plan().fusion_chooser_flags(chooser))
    assert flags[flags.index("--weights") + 1 : flags.index("--normalizations")] == ["0.5", "0.7"]
    assert flags[flags.index("--normalizations") + 1 : flags.index("--rrf-k")] == ["theoretical", "minmax"]
    assert inputs["encoders"] == [r.replace("run.parquet", "encoder.json") for r in inputs["runs"]]
    assert flags[flags.index("--selection") + 1] == inputs["selection"]
    # no grid: the one point's run, no choice among runs
    alone = plan(grid=False).fusion_chooser_inputs(chooser)
    assert alone["runs"] == ["results/docs/none/seed-13/select/configured/heldout/run.parquet"]
    assert "selection" not in alone and "--selection" not in plan(grid=False).fusion_chooser_flags(chooser)
    zeroshot = W(collection="docs", method="none", chooser="zeroshot")
    assert plan().fusion_chooser_inputs(zeroshot)["runs"] == [
        "results/docs/none/zeroshot/heldout/run.parquet"
    ]
    assert "selection" not in plan().fusion_chooser_inputs(zeroshot)


def test_a_fused_row_reads_its_dense_run_bm25_s_and_the_file_holding_its_weight():
    row = W(collection="docs", method="none", fused="seed-13/r2")
    assert plan().fused_inputs(row) == {
        "dense": "results/docs/none/seed-13/r2/run.parquet",
        "bm25": "results/docs/bm25/run.parquet",
        "fusion": "results/docs/none/seed-13/select/fusion.json",
        "encoder": "results/docs/none/seed-13/r2/encoder.json",
    }
    assert "fusion" not in plan(method="rrf").fused_inputs(row)
    assert plan().fused_tag(row) == "none-seed-13-r2-bm25"
    zeroshot = W(collection="docs", method="none", fused="zeroshot")
    assert plan().fusion_file(zeroshot) == "results/docs/none/zeroshot/fusion.json"
    assert plan(method="rrf").fuse_flags(row) == "--method rrf --rrf-k 60 --depth 100"
    assert plan().fuse_flags(row).endswith(" --fusion results/docs/none/seed-13/select/fusion.json")


def test_the_comparison_reads_each_choice_once():
    files = plan(seeds=[1, 2]).selection_files()
    assert files == [
        "results/docs/none/seed-1/select/selection.json",
        "results/docs/none/seed-2/select/selection.json",
        "results/docs/none/zeroshot/fusion.json",
        "results/docs/none/seed-1/select/fusion.json",
        "results/docs/none/seed-2/select/fusion.json",
    ]
    assert plan(grid=False, method="rrf").selection_files() == []
    assert plan(grid=False, fused=["zeroshot"]).selection_files() == [
        "results/docs/none/zeroshot/fusion.json"
    ]


def test_with_per_seed_false_every_seed_reads_the_first_seed_s_choices():
    """finetune.select.per_seed false: seed 14's rows read seed 13's selection.json and fusion.json,
    and the comparison's held-out section lists each choice once."""
    p = plan(seeds=(13, 14), per_seed=False, negatives=True, stages=("r1", "r2", "rerank"))
    r2 = W(collection="docs", method="none", seed="14", trained="r2")
    assert p.selection_file(r2) == [
        "results/docs/none/seed-13/select/selection.json",
        "results/docs/none/seed-13/select/r2/selection.json",
    ]
    assert p.reranker_selection(W(collection="docs", method="none", seed="14")) == (
        "results/docs/none/seed-13/select/rerank/selection.json"
    )
    fused = W(collection="docs", method="none", fused="seed-14/r2")
    assert p.fusion_file(fused) == "results/docs/none/seed-13/select/fusion.json"
    files = p.selection_files()
    assert files and not [f for f in files if "seed-14" in f]
    # per seed (the default): each seed its own
    own = plan(seeds=(13, 14), negatives=True)
    assert own.selection_file(r2)[0] == "results/docs/none/seed-14/select/selection.json"
    assert own.fusion_file(fused) == "results/docs/none/seed-14/select/fusion.json"


def test_with_select_by_every_method_reads_that_method_s_choices():
    """finetune.select.by none: cocondenser's rows read none's selection.json and its trained rows'
    fusion.json (its zeroshot row's fusion weight stays its own); with per_seed false, seed 15 of a
    method seeds_of gives three seeds reads none's first seed's; per seed, its own seed's of none."""
    p = plan(
        methods=("none", "cocondenser"),
        by="none",
        per_seed=False,
        seeds_of={"none": [13, 14, 15], "cocondenser": [13, 14, 15]},
    )
    r1 = W(collection="docs", method="cocondenser", seed="15", trained="r1")
    assert p.selection_file(r1) == ["results/docs/none/seed-13/select/selection.json"]
    fused = W(collection="docs", method="cocondenser", fused="seed-15/r1")
    assert p.fusion_file(fused) == "results/docs/none/seed-13/select/fusion.json"
    zeroshot = W(collection="docs", method="cocondenser", fused="zeroshot")
    assert p.fusion_file(zeroshot) == "results/docs/cocondenser/zeroshot/fusion.json"
    assert [f for f in p.selection_files() if f.endswith("selection.json")] == [
        "results/docs/none/seed-13/select/selection.json"
    ]
    own = plan(methods=("none", "cocondenser"), by="none", seeds=(13, 14))
    r1 = W(collection="docs", method="cocondenser", seed="14", trained="r1")
    assert own.selection_file(r1) == ["results/docs/none/seed-14/select/selection.json"]
    # without by: each method its own
    assert plan(methods=("none", "cocondenser")).selection_file(r1)[0] == (
        "results/docs/cocondenser/seed-14/select/selection.json"
    )
