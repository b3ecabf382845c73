"""Training groups (positives never negatives, the mixing of two pools) and reranking a run."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dprflow.finetuning.examples import TrainingQuery, build_training_queries, sample_group
from dprflow.finetuning.reranking import rerank_run


def test_groups_start_with_a_positive_and_never_sample_positives_as_negatives():
    passages = pd.DataFrame({"passage_id": ["a#0", "a#1", "b#0", "c#0"], "doc_id": ["a", "a", "b", "c"]})
    queries = pd.DataFrame({"query_id": ["q"], "text": ["t"], "split": ["train"]})
    qrels = pd.DataFrame({"query_id": ["q"], "doc_id": ["a"], "relevance": [1]})
    # A pool that (wrongly) still holds a positive: it must be removed and counted.
    pool = pd.DataFrame(
        {
            "query_id": ["q"] * 3,
            "passage_id": ["a#1", "b#0", "c#0"],
            "score": [3.0, 2.0, 1.0],
            "rank": [1, 2, 3],
        }
    )
    items, counts = build_training_queries(queries, "train", qrels, passages, pool)
    assert counts["negatives_that_were_positives_removed"] == 1
    (item,) = items
    assert sorted(item.positives) == ["a#0", "a#1"] and item.negatives == ["b#0", "c#0"]
    rng = np.random.default_rng(0)
    for _ in range(200):
        group = sample_group(rng, item, 4)
        assert group[0] in {"a#0", "a#1"}
        assert set(group[1:]) <= {"b#0", "c#0"}  # a pool of 2 for 3 slots: drawn with replacement


def test_extra_pool_fraction():
    item = TrainingQuery("q", "t", ["p"], [f"m{i}" for i in range(50)], [f"b{i}" for i in range(50)])
    group = sample_group(np.random.default_rng(1), item, 9, extra_fraction=0.25)
    assert sum(g.startswith("b") for g in group) == 2 and sum(g.startswith("m") for g in group) == 6
    assert len(set(group[1:])) == 8  # without replacement when the pools are large enough


def test_rerank_reorders_the_top_and_keeps_the_rest_below():
    run = pd.DataFrame(
        {
            "query_id": ["q"] * 4,
            "passage_id": ["a", "b", "c", "d"],
            "score": np.float32([4, 3, 2, 1]),
            "rank": np.int32([1, 2, 3, 4]),
        }
    )
    out = rerank_run(run, np.array([0.1, 0.9, 0.5]), depth=3)
    assert out["passage_id"].tolist() == ["b", "c", "a", "d"]
    assert out["rank"].tolist() == [1, 2, 3, 4]
    assert out["score"].is_monotonic_decreasing
