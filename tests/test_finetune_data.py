"""Training groups (positives never negatives, the mixing of two pools) and reranking a run."""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dprflow.data.ids import IdIndex
from dprflow.data.schemas import write_table
from dprflow.errors import StageError
from dprflow.finetuning.examples import PassageTexts, TrainingQuery, build_training_set, sample_group
from dprflow.finetuning.reranking import rerank_run
from dprflow.models.texts import passage_texts
from dprflow.search.runs import positive_passages


def pieces(*frames: pd.DataFrame):
    """A pool table given in pieces of the columns asked for, as the stage streams it (once a pass)."""
    return lambda columns: (frame[columns] for frame in frames)


def test_groups_start_with_a_positive_and_never_sample_positives_as_negatives():
    passages = pd.DataFrame({"passage_id": ["a#0", "a#1", "b#0", "c#0"], "doc_id": ["a", "a", "b", "c"]})
    queries = pd.DataFrame({"query_id": ["q"], "text": ["t"], "split": ["train"]})
    qrels = pd.DataFrame({"query_id": ["q"], "doc_id": ["a"], "relevance": [1]})
    # A pool that (wrongly) still holds a positive: it must be removed and counted.
    pool = pd.DataFrame({"query_id": ["q"] * 3, "passage_id": ["a#1", "b#0", "c#0"], "rank": [1, 2, 3]})
    ids = pd.Index(passages["passage_id"])
    index = IdIndex(pa.array(ids))
    items, counts = build_training_set(
        queries, "train", positive_passages(qrels, passages), index, pieces(pool)
    )
    assert counts["negatives_that_were_positives_removed"] == 1
    (item,) = items
    assert sorted(ids[item.positives]) == ["a#0", "a#1"] and list(ids[item.negatives]) == ["b#0", "c#0"]
    rng = np.random.default_rng(0)
    for _ in range(200):
        group = ids[sample_group(rng, item, 4)]
        assert group[0] in {"a#0", "a#1"}
        assert set(group[1:]) <= {"b#0", "c#0"}  # a pool of 2 for 3 slots: drawn with replacement


def reference_training_queries(queries, split, positives, pools, extra, teacher):
    """The whole-table builder the streamed one replaced (Python lists and dicts of ids): the oracle."""
    pos = positives.groupby("query_id")["passage_id"].agg(list).to_dict()

    def grouped(frame):
        ordered = frame.sort_values(["query_id", "rank"], kind="stable")
        return ordered.groupby("query_id", sort=False)["passage_id"].agg(list).to_dict()

    pools, extra = grouped(pools), grouped(extra)
    scores = {q: dict(zip(g["passage_id"], g["score"], strict=True)) for q, g in teacher.groupby("query_id")}
    counts = {"skipped_no_positive": 0, "skipped_empty_negative_pool": 0, "skipped_no_teacher_scores": 0}
    removed, items = 0, []
    for qid, text in queries.loc[queries["split"] == split, ["query_id", "text"]].itertuples(index=False):
        p = pos.get(qid, [])
        if not p:
            counts["skipped_no_positive"] += 1
            continue
        clean = [x for x in pools.get(qid, []) if x not in p]
        removed += len(pools.get(qid, [])) - len(clean)
        if not clean:
            counts["skipped_empty_negative_pool"] += 1
            continue
        t = scores.get(qid, {})
        p, clean = [x for x in p if x in t], [x for x in clean if x in t]
        if not p or not clean:
            counts["skipped_no_teacher_scores"] += 1
            continue
        items.append((qid, text, p, clean, [x for x in extra.get(qid, []) if x not in pos[qid]], t))
    return items, {**counts, "negatives_that_were_positives_removed": removed}


def test_the_streamed_pools_are_the_whole_table_path_s_and_draw_the_same_groups():
    rng = np.random.default_rng(7)
    ids = pd.Index([f"p{i}" for i in rng.permutation(300)])
    queries = pd.DataFrame(
        {
            "query_id": [f"q{i}" for i in range(60)],
            "text": [f"query {i}" for i in range(60)],
            "split": ["train"] * 50 + ["test"] * 10,
        }
    )
    positives = pd.DataFrame(
        {
            "query_id": ["q0", "q1"] + [f"q{i}" for i in rng.integers(0, 55, 80)],
            "passage_id": ids[rng.integers(0, 300, 82)],
        }
    ).drop_duplicates()

    def pool_table(n):
        # Rows of every query (test queries too), out of rank order, ranks with ties, positives among them.
        return pd.DataFrame(
            {
                "query_id": [f"q{i}" for i in rng.integers(0, 60, n)],
                "passage_id": ids[rng.integers(0, 300, n)],
                "rank": rng.integers(1, 40, n).astype(np.int32),
            }
        ).drop_duplicates(["query_id", "passage_id"])

    pools, extra = pool_table(2000), pool_table(800)
    pools = pd.concat([pools, positives.assign(rank=np.int32(3))], ignore_index=True).sample(
        frac=1, random_state=1
    )
    teacher = pools.sample(frac=0.9, random_state=2)[["query_id", "passage_id"]]
    teacher = teacher.assign(score=rng.normal(size=len(teacher)))
    teacher = pd.concat([teacher, positives.assign(score=1.0)]).drop_duplicates(["query_id", "passage_id"])
    # q0's pool is its positives only (an empty pool once they are removed); q1's positives have
    # no teacher score (skipped when distilling).
    pools = pd.concat(
        [pools[pools["query_id"] != "q0"], positives[positives["query_id"] == "q0"].assign(rank=1)]
    )
    teacher = teacher[~teacher["query_id"].eq("q1") | ~teacher["passage_id"].isin(positives["passage_id"])]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scores.parquet"
        write_table(teacher, path, "scores")
        items, counts = build_training_set(
            queries,
            "train",
            positives,
            IdIndex(pa.array(ids)),
            pieces(*(pools.iloc[i : i + 300] for i in range(0, len(pools), 300))),
            pieces(extra),
            str(path),
        )
    want, want_counts = reference_training_queries(queries, "train", positives, pools, extra, teacher)
    assert {k: counts[k] for k in want_counts} == want_counts and counts["kept"] == len(want) > 20
    assert counts["skipped_empty_negative_pool"] == counts["skipped_no_teacher_scores"] == 1
    for item, (qid, text, pos, neg, more, scores) in zip(items, want, strict=True):
        assert (item.query_id, item.text) == (qid, text)
        assert list(ids[item.positives]) == pos and list(ids[item.negatives]) == neg
        assert list(ids[item.extra_negatives]) == more
        assert {ids[r]: s for r, s in item.teacher.items()} == pytest.approx(
            {p: scores[p] for p in pos + neg}
        )
        for seed in range(3):
            mine = sample_group(np.random.default_rng(seed), item, 6, extra_fraction=0.4)
            old = TrainingQuery(qid, text, pos, neg, more)
            assert list(ids[mine]) == sample_group(np.random.default_rng(seed), old, 6, extra_fraction=0.4)


def test_a_pool_passage_missing_from_the_passages_is_an_error_naming_the_table():
    queries = pd.DataFrame({"query_id": ["q"], "text": ["t"], "split": ["train"]})
    positives = pd.DataFrame({"query_id": ["q"], "passage_id": ["a"]})
    pool = pd.DataFrame({"query_id": ["q", "q"], "passage_id": ["b", "zz"], "rank": [1, 2]})
    with pytest.raises(StageError, match=r"r1/negatives.parquet: passage 'zz' \(query 'q'\)"):
        build_training_set(
            queries,
            "train",
            positives,
            IdIndex(pa.array(["a", "b"])),
            pieces(pool),
            where="r1/negatives.parquet",
        )


def test_passage_texts_are_read_back_from_disk_in_any_process(tmp_path):
    passages = pd.DataFrame(
        {
            "passage_id": ["a", "b", "c"],
            "doc_id": ["a", "b", "c"],
            "position": np.int32([0, 0, 0]),
            "title": ["Été", "", "  t "],
            "text": ["premier passage", "second ☃", ""],
            "n_tokens": np.int32([2, 2, 0]),
        }
    )
    write_table(passages, tmp_path / "passages.parquet", "passages")
    texts, ids = PassageTexts.write(tmp_path / "passages.parquet", tmp_path / "texts", "[SEP]")
    want = passage_texts(passages, "[SEP]")
    assert ids.rows(pa.array(["c", "a", "zz", "b"])).tolist() == [2, 0, -1, 1] and len(texts) == 3
    assert [texts[i] for i in (2, 0, 1)] == [want["c"], want["a"], want["b"]]
    assert want["a"] == "Été [SEP] premier passage" and want["b"] == "second ☃"
    again = pickle.loads(pickle.dumps(texts))  # a DataLoader worker started by spawn
    assert [again[i] for i in range(3)] == [want[k] for k in "abc"]
    # One started by fork. Its worker takes SIGTERM's default action whatever handler this test
    # process holds (Pool.__exit__ terminates with SIGTERM, then joins), and the wait is bounded.
    fork = multiprocessing.get_context("fork")
    with fork.Pool(1, initializer=signal.signal, initargs=(signal.SIGTERM, signal.SIG_DFL)) as pool:
        assert pool.map_async(texts.__getitem__, [1, 0]).get(timeout=600) == [want["b"], want["a"]]
    write_table(passages.assign(passage_id=["a", "b", "a"]), tmp_path / "twice.parquet", "passages")
    with pytest.raises(StageError, match="twice.parquet: passage id 'a' is on more than one row"):
        PassageTexts.write(tmp_path / "twice.parquet", tmp_path / "texts2", "[SEP]")


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
