"""dprflow.plan.run_rows: the rows a config's run scores, as the rules list them."""

from __future__ import annotations

from dprflow.plan.run_rows import RunRows


def config(**over) -> dict:
    """The keys RunRows reads, as a validated config has them."""
    base = {
        "collections": {"docs": {"evaluate_only": False, "evaluate_on": []}},
        "methods": ["none"],
        "seeds": [],
        "finetune": {
            "seed": 13,
            "stages": ["r1", "r2"],
            "stages_of": {},
            "fusion": {"rows": ["zeroshot", "r2"]},
        },
    }
    for key, value in over.items():
        if key == "fusion_rows":
            base["finetune"]["fusion"]["rows"] = value
        elif key in base["finetune"]:
            base["finetune"][key] = value
        else:
            base[key] = value
    return base


def test_one_collection_one_method_lists_each_row_once():
    plan = RunRows(config(), [])
    assert plan.untrained() == ["bm25", "none/zeroshot"]
    assert plan.trained() == ["none/seed-13/r1", "none/seed-13/r2"]
    assert plan.fused() == ["none/zeroshot+bm25", "none/seed-13/r2+bm25"]
    assert [row for _, row in plan.scored()] == plan.systems()
    assert plan.comparison() == [
        "bm25",
        "none/zeroshot",
        "none/r1",
        "none/r2",
        "none/zeroshot+bm25",
        "none/r2+bm25",
    ]


def test_stages_follow_the_pipeline_s_order_and_a_method_s_own_list():
    plan = RunRows(
        config(methods=["none", "contriever"], stages=["r2", "r1"], stages_of={"contriever": ["r1"]}), []
    )
    assert plan.stages("none") == ["r1", "r2"]
    assert plan.stages("contriever") == ["r1"]
    # Contriever's pre-trained encoder is a row as it is (its unsupervised setting), and fused
    assert plan.trained() == [
        "contriever/zeroshot",
        "none/seed-13/r1",
        "none/seed-13/r2",
        "contriever/seed-13/r1",
    ]
    assert plan.fused() == ["none/zeroshot+bm25", "contriever/zeroshot+bm25", "none/seed-13/r2+bm25"]


def test_seeds_repeat_the_fine_tuning_and_fold_away_in_the_comparison():
    plan = RunRows(config(seeds=[1, 2], fusion_rows=[]), ["ref-bge"])
    assert plan.seeds() == [1, 2]
    assert plan.untrained() == ["bm25", "none/zeroshot", "ref-bge/zeroshot"]
    assert plan.trained() == ["none/seed-1/r1", "none/seed-1/r2", "none/seed-2/r1", "none/seed-2/r2"]
    assert plan.comparison() == ["bm25", "none/zeroshot", "ref-bge/zeroshot", "none/r1", "none/r2"]


def test_seeds_of_gives_a_method_its_own_seeds():
    """seeds_of: the methods it names run their seeds, the others the run's (here finetune.seed)."""
    plan = RunRows(
        config(methods=["none", "condenser"], stages=["r1"], fusion_rows=["r1"], seeds_of={"none": [13, 14]}),
        [],
    )
    assert plan.seeds("none") == [13, 14] and plan.seeds("condenser") == [13] and plan.seeds() == [13]
    assert plan.trained() == ["none/seed-13/r1", "none/seed-14/r1", "condenser/seed-13/r1"]
    assert plan.fused() == ["none/seed-13/r1+bm25", "none/seed-14/r1+bm25", "condenser/seed-13/r1+bm25"]
    assert plan.comparison()[-4:] == ["none/r1", "condenser/r1", "none/r1+bm25", "condenser/r1+bm25"]


def test_a_row_of_seeds_of_gives_that_row_its_seeds_and_the_method_s_other_rows_the_run_s():
    plan = RunRows(config(fusion_rows=["r1"], seeds_of={"none/r1": [13, 14]}), [])
    assert plan.seeds("none", "r1") == [13, 14] and plan.seeds("none", "r2") == [13]
    assert plan.seeds("none") == [13, 14]
    assert plan.trained() == ["none/seed-13/r1", "none/seed-13/r2", "none/seed-14/r1"]
    assert plan.fused() == ["none/seed-13/r1+bm25", "none/seed-14/r1+bm25"]
    # a row key wins over its method's
    plan = RunRows(config(seeds_of={"none": [1, 2], "none/r2": [1]}), [])
    assert plan.trained() == ["none/seed-1/r1", "none/seed-1/r2", "none/seed-2/r1"]


def test_transfer_scores_the_trained_rows_on_the_targets_in_the_training_collection_s_folder():
    collections = {
        "a": {"evaluate_only": False, "evaluate_on": ["b", "a"]},
        "b": {"evaluate_only": False, "evaluate_on": []},
        "c": {"evaluate_only": True, "evaluate_on": []},
    }
    plan = RunRows(config(collections=collections, stages=["r1"], fusion_rows=[]), [])
    assert plan.training_collections() == ["a", "b"]
    assert plan.transfer_targets("a") == ["b", "c"]  # its own name left out, then evaluate-only ones
    assert plan.transfer_targets("b") == ["c"]
    scored = plan.scored()
    assert ("c", "none/zeroshot") in scored and ("c", "none/seed-13/r1") not in scored
    assert [row for c, row in scored if c == "a" and "/on-" in row] == [
        "none/seed-13/r1/on-b",
        "none/seed-13/r1/on-c",
    ]
    assert plan.comparison() == ["bm25", "none/zeroshot", "none/r1"]
