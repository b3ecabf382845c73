"""dprflow.plan.selection: what the selection's and the fused rows' jobs read, and their flags."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace as W

import pytest

from dprflow.plan.run_rows import RunRows
from dprflow.plan.selection import SelectionPlan

POINTS = {"learning_rate=2e-05": {"learning_rate": 2e-5}, "learning_rate=5e-05": {"learning_rate": 5e-5}}


def plan(grid=True, method="convex", fused=("zeroshot", "r2"), seeds=()) -> SelectionPlan:
    config = {
        "collections": {"docs": {"evaluate_only": False, "evaluate_on": []}},
        "methods": ["none"],
        "seeds": list(seeds),
        "finetune": {
            "seed": 13,
            "stages": ["r1", "r2"],
            "stages_of": {},
            "search_depth": 100,
            "select": {"retriever": {"learning_rate": [2e-5, 5e-5]} if grid else {}, "metric": "nDCG@10"},
            "fusion": {"method": method, "rows": list(fused), "weights": [0.5, 0.7], "rrf_k": 60},
        },
    }
    return SelectionPlan(config, "results", POINTS if grid else {"configured": {}}, RunRows(config, []))


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


def test_a_weight_is_chosen_only_where_a_fused_row_reads_it():
    assert plan().chooses_weight("zeroshot") and plan().chooses_weight("seed-13/select")
    assert not plan(fused=["r2"]).chooses_weight("zeroshot")
    assert not plan(fused=["zeroshot"]).chooses_weight("seed-13/select")
    assert not plan(method="rrf").chooses_weight("zeroshot")


def test_the_chooser_reads_every_point_s_held_out_run_in_grid_order_and_bm25_s_for_a_weight():
    chooser = W(collection="docs", method="none", chooser="seed-13/select")
    inputs = plan().chooser_inputs(chooser)
    assert inputs["runs"] == [f"results/docs/none/seed-13/select/{p}/heldout/run.parquet" for p in POINTS]
    assert inputs["bm25"] == "results/docs/bm25/heldout/run.parquet"
    assert "bm25" not in plan(fused=["zeroshot"]).chooser_inputs(chooser)
    flags = shlex.split(plan().chooser_flags(chooser))
    assert json.loads(flags[flags.index("--grid") + 1]) == list(POINTS.values())
    assert flags[flags.index("--weights") + 1 : flags.index("--depth")] == ["0.5", "0.7"]
    zeroshot = W(collection="docs", method="none", chooser="zeroshot")
    assert plan().chooser_inputs(zeroshot)["runs"] == ["results/docs/none/zeroshot/heldout/run.parquet"]


def test_a_fused_row_reads_its_dense_run_bm25_s_and_the_selection_holding_its_weight():
    row = W(collection="docs", method="none", fused="seed-13/r2")
    assert plan().fused_inputs(row) == {
        "dense": "results/docs/none/seed-13/r2/run.parquet",
        "bm25": "results/docs/bm25/run.parquet",
        "selection": "results/docs/none/seed-13/select/selection.json",
    }
    assert "selection" not in plan(method="rrf").fused_inputs(row)
    assert plan().fused_tag(row) == "none-seed-13-r2-bm25"
    zeroshot = W(collection="docs", method="none", fused="zeroshot")
    assert plan().fusion_selection(zeroshot) == "results/docs/none/zeroshot/selection.json"
    assert plan(method="rrf").fuse_flags(row) == "--method rrf --rrf-k 60 --depth 100"


def test_the_comparison_reads_each_selection_once():
    files = plan(seeds=[1, 2]).selection_files()
    assert files == [
        "results/docs/none/seed-1/select/selection.json",
        "results/docs/none/seed-2/select/selection.json",
        "results/docs/none/zeroshot/selection.json",
    ]
    assert plan(grid=False, method="rrf").selection_files() == []
