"""Settings chosen on held-out training queries and rows fused with BM25 (docs/selection.md):
the split, the grid, the winner of a known table, a fused run of two known runs, the stages on
small tables, and what a dry run plans."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest
from dry_runs import all_methods_plan, commands_by_rule

from dprflow.data.schemas import read_table, write_table
from dprflow.errors import StageError
from dprflow.finetuning.grid_edges import describe, grid_edges
from dprflow.finetuning.selection import (
    apply_selections,
    apply_settings,
    best_point,
    chosen_path,
    grid_points,
    heldout_ids,
    point_name,
)
from dprflow.search.fusion import dense_lower_bound, fuse_runs
from dprflow.stages import compare, fuse, heldout_queries, select_fusion, select_settings


def run_table(rows):
    """A run from (query, passage, score) rows, ranked by score within each query."""
    run = pd.DataFrame(rows, columns=["query_id", "passage_id", "score"])
    run["score"] = run["score"].astype("float32")
    run["rank"] = run.groupby("query_id").cumcount().astype("int32") + 1
    return run


# ---- the split and the grid ----------------------------------------------------------------------


def test_heldout_ids_are_seeded_counted_and_independent_of_order():
    ids = [f"q{i}" for i in range(100)]
    held = heldout_ids(ids, 0.2, 2000, seed=13)
    assert len(held) == 20 and held <= set(ids)
    assert heldout_ids(reversed(ids), 0.2, 2000, seed=13) == held
    assert heldout_ids(ids, 0.2, 2000, seed=14) != held
    assert len(heldout_ids(ids, 0.2, 7, seed=13)) == 7  # max_queries caps it
    assert len(heldout_ids(["a", "b"], 0.9, 2000, seed=13)) == 1  # never every query
    assert len(heldout_ids(["a", "b", "c"], 0.01, 2000, seed=13)) == 1  # at least one
    with pytest.raises(StageError, match="1 judged training queries"):
        heldout_ids(["a", "a"], 0.2, 2000, seed=13)


def test_grid_points_are_every_combination_named_by_their_settings():
    points = grid_points({"learning_rate": [2e-5, 5e-5], "epochs": [1, 4]})
    assert points == [
        {"learning_rate": 2e-5, "epochs": 1},
        {"learning_rate": 2e-5, "epochs": 4},
        {"learning_rate": 5e-5, "epochs": 1},
        {"learning_rate": 5e-5, "epochs": 4},
    ]
    assert [point_name(p) for p in points][-1] == "learning_rate=5e-05,epochs=4"
    assert point_name({"temperature": None, "epochs": 2}) == "temperature=null,epochs=2"
    assert grid_points({}) == [{}] and point_name({}) == "configured"
    with pytest.raises(ValueError, match="unknown setting 'dropout'"):
        grid_points({"dropout": [0.1]})
    # a reranker's grid has its own settings: a head learning rate, no temperature
    assert grid_points({"head_learning_rate": [0, 1e-3]}, "reranker") == [
        {"head_learning_rate": 0},
        {"head_learning_rate": 1e-3},
    ]
    with pytest.raises(ValueError, match=r"finetune.select.reranker: unknown setting 'temperature'"):
        grid_points({"temperature": [0.05]}, "reranker")


def test_the_best_point_of_a_known_table():
    assert best_point({"a": 0.61, "b": 0.70, "c": 0.65}) == "b"
    assert best_point({"a": 0.70, "b": 0.70}) == "a"  # a tie: the grid's first
    assert best_point({"a": math.nan, "b": 0.1}) == "b"
    assert best_point({0.3: 0.5, 0.7: 0.6, None: 0.2}) == 0.7
    with pytest.raises(StageError):
        best_point({"a": math.nan})


def test_apply_settings_sets_the_chosen_values_and_refuses_others(tmp_path):
    path = tmp_path / "selection.json"
    path.write_text(json.dumps({"retriever": {"settings": {"learning_rate": 5e-5, "epochs": 4}}}))
    args = SimpleNamespace(learning_rate=2e-5, epochs=1, batch_size=8)
    assert apply_settings(args, path) == {"learning_rate": 5e-5, "epochs": 4}
    assert (args.learning_rate, args.epochs, args.batch_size) == (5e-5, 4, 8)
    path.write_text(json.dumps({"retriever": {"settings": {"init": "other"}}}))
    with pytest.raises(StageError, match="settings.init is not a setting"):
        apply_settings(args, path)
    # the reranker's section: its own settings, read from its own key
    path.write_text(json.dumps({"reranker": {"settings": {"head_learning_rate": 1e-3, "epochs": 2}}}))
    reranker = SimpleNamespace(head_learning_rate=0.0, epochs=1)
    assert apply_settings(reranker, path, "reranker") == {"head_learning_rate": 1e-3, "epochs": 2}
    assert (reranker.head_learning_rate, reranker.epochs) == (1e-3, 2)
    with pytest.raises(KeyError):
        apply_settings(reranker, path)  # no retriever choice in that file
    path.write_text(json.dumps({"reranker": {"settings": {"temperature": 0.05}}}))
    with pytest.raises(StageError, match="reranker.settings.temperature is not a setting"):
        apply_settings(SimpleNamespace(temperature=1.0), path, "reranker")
    # r2 reads two files: the retriever's choice and the negatives' mix (its argument extra_fraction)
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"negatives": {"settings": {"r2_bm25_fraction": 0.5}}}))
    path.write_text(json.dumps({"retriever": {"settings": {"learning_rate": 5e-5}}}))
    r2 = SimpleNamespace(learning_rate=2e-5, extra_fraction=0.0)
    got = apply_selections(r2, [str(path), str(mix)], ("retriever", "negatives"))
    assert got == {"learning_rate": 5e-5, "r2_bm25_fraction": 0.5} and r2.extra_fraction == 0.5
    with pytest.raises(StageError, match="no choice of reranker"):
        apply_selections(r2, [str(mix)], ("reranker",))


def test_the_chosen_point_s_file_is_taken_by_name(tmp_path):
    selection = tmp_path / "selection.json"
    points = [{"point": "a"}, {"point": "b"}, {"point": "c"}]
    selection.write_text(json.dumps({"retriever": {"points": points, "best": "b"}}))
    assert chosen_path(["ra", "rb", "rc"], str(selection)) == "rb"
    assert chosen_path(["only"], None) == "only"
    with pytest.raises(StageError, match="3 grid points, but 2 files"):
        chosen_path(["ra", "rb"], str(selection))
    with pytest.raises(StageError, match="no selection.json"):
        chosen_path(["ra", "rb"], None)


# ---- fusion --------------------------------------------------------------------------------------

DENSE = run_table([("q1", "a", 0.9), ("q1", "b", 0.5), ("q1", "c", 0.1), ("q2", "a", 0.3), ("q2", "b", 0.2)])
BM25 = run_table([("q1", "c", 10.0), ("q1", "b", 2.0), ("q2", "b", 5.0), ("q2", "a", 1.0)])


def test_convex_fusion_of_two_known_runs():
    fused = fuse_runs(DENSE, BM25, "convex", 0.7, 60, 1000)
    got = {(r.query_id, r.passage_id): (round(float(r.score), 6), int(r.rank)) for r in fused.itertuples()}
    # q1: dense min-max a 1, b 0.5, c 0; BM25 c 1, b 0, a missing (0)
    # q2: dense a 1, b 0; BM25 b 1, a 0
    assert got == {
        ("q1", "a"): (0.7, 1),
        ("q1", "b"): (0.35, 2),
        ("q1", "c"): (0.3, 3),
        ("q2", "a"): (0.7, 1),
        ("q2", "b"): (0.3, 2),
    }
    assert fuse_runs(DENSE, BM25, "convex", 0.2, 60, 1000).query("query_id == 'q2'")[
        "passage_id"
    ].tolist() == ["b", "a"]
    assert len(fuse_runs(DENSE, BM25, "convex", 0.7, 60, 2)) == 4  # the depth per query


def test_theoretical_minmax_fusion_of_two_known_runs():
    """Bruch et al.'s TMM: the dense cosine's bound -1 and BM25's 0 instead of each list's lowest
    score. Here it moves c above a in q1 (c is BM25's best and the dense run's third)."""
    fused = fuse_runs(DENSE, BM25, "convex", 0.7, 60, 1000, "theoretical", -1.0)
    got = {(r.query_id, r.passage_id): round(float(r.score), 4) for r in fused.itertuples()}
    # q1: dense (s + 1) / 1.9: a 1, b 0.7895, c 0.5789; BM25 s / 10: c 1, b 0.2, a missing (0)
    # q2: dense (s + 1) / 1.3: a 1, b 0.9231; BM25 s / 5: b 1, a 0.2
    assert got == pytest.approx(
        {
            ("q1", "c"): 0.7053,
            ("q1", "a"): 0.7,
            ("q1", "b"): 0.6126,
            ("q2", "b"): 0.9462,
            ("q2", "a"): 0.76,
        },
        abs=1e-4,
    )
    assert fused.query("query_id == 'q1'")["passage_id"].tolist() == ["c", "a", "b"]
    # a dot product has no bound: its scores are min-max normalised, BM25's still divided by its max
    dot = fuse_runs(DENSE, BM25, "convex", 0.7, 60, 1000, "theoretical", None)
    got = {(r.query_id, r.passage_id): round(float(r.score), 4) for r in dot.itertuples()}
    assert got[("q1", "b")] == pytest.approx(0.7 * 0.5 + 0.3 * 0.2) and got[("q1", "c")] == pytest.approx(0.3)
    assert (
        dense_lower_bound({"similarity": "cosine"}) == -1.0
        and dense_lower_bound({"similarity": "dot"}) is None
    )
    with pytest.raises(ValueError, match="unknown normalisation 'z'"):
        fuse_runs(DENSE, BM25, "convex", 0.7, 60, 1000, "z", None)


def test_rrf_of_two_known_runs():
    fused = fuse_runs(DENSE, BM25, "rrf", 0.0, 60, 1000).query("query_id == 'q1'")
    scores = dict(zip(fused["passage_id"], fused["score"].astype(float), strict=True))
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62 + 1 / 62)
    assert scores["a"] == pytest.approx(1 / 61)
    assert fused["passage_id"].tolist() == ["c", "b", "a"]


def test_fuse_stage_pairs_queries_listed_in_other_orders(tmp_path):
    write_table(DENSE, tmp_path / "dense.parquet", "run")
    write_table(BM25.iloc[::-1].reset_index(drop=True), tmp_path / "bm25.parquet", "run")
    (tmp_path / "fusion.json").write_text(
        json.dumps({"method": "convex", "normalization": "theoretical", "weight": 0.7})
    )
    (tmp_path / "encoder.json").write_text(json.dumps({"pooling": "mean", "similarity": "cosine"}))
    args = ["--dense", str(tmp_path / "dense.parquet"), "--bm25", str(tmp_path / "bm25.parquet")]
    out = ["--out", str(tmp_path / "run.parquet"), "--trec", str(tmp_path / "run.trec")]
    assert fuse.main([*args, *out, "--fusion", str(tmp_path / "fusion.json")]) == 0
    fused = read_table(tmp_path / "run.parquet", "run")
    expected = fuse_runs(DENSE, BM25, "convex", 0.7, 60, 1000, "theoretical", -1.0)
    pd.testing.assert_frame_equal(
        fused.sort_values(["query_id", "rank"]).reset_index(drop=True), expected, check_exact=False
    )
    assert (tmp_path / "run.trec").read_text().count("\n") == len(expected)
    # the convex combination needs the weight chosen on held-out queries
    (tmp_path / "fusion.json").write_text(json.dumps({"retriever": {}}))
    assert fuse.main([*args, *out, "--fusion", str(tmp_path / "fusion.json")]) == 1


# ---- the stages on small tables ------------------------------------------------------------------


@pytest.fixture
def collection(tmp_path):
    """20 training and 5 test queries; passage p<i> of document d<i> is relevant to query t<i>."""
    queries = pd.DataFrame(
        {
            "query_id": [f"t{i}" for i in range(20)] + [f"x{i}" for i in range(5)],
            "text": ["q"] * 25,
            "split": ["train"] * 20 + ["test"] * 5,
        }
    )
    qrels = pd.DataFrame(
        {"query_id": queries["query_id"], "doc_id": [f"d{i}" for i in range(25)], "relevance": 1}
    )
    qrels["relevance"] = qrels["relevance"].astype("int32")
    passages = pd.DataFrame(
        {
            "passage_id": [f"p{i}" for i in range(25)],
            "doc_id": [f"d{i}" for i in range(25)],
            "position": 0,
            "title": "",
            "text": "t",
            "n_tokens": 1,
        }
    ).astype({"position": "int32", "n_tokens": "int32"})
    for name, table in (("queries", queries), ("qrels", qrels), ("passages", passages)):
        write_table(table, tmp_path / f"{name}.parquet", name)
    return tmp_path


def test_heldout_queries_hold_no_test_query(collection):
    out = collection / "heldout.parquet"
    argv = ["--queries", str(collection / "queries.parquet"), "--qrels", str(collection / "qrels.parquet")]
    argv += ["--min-queries", "5"]
    assert heldout_queries.main([*argv, "--split", "train", "--out", str(out), "--fraction", "0.25"]) == 0
    split = read_table(out, "queries")
    assert sorted(split["query_id"]) == sorted(f"t{i}" for i in range(20))
    assert split["split"].value_counts().to_dict() == {"fit": 15, "heldout": 5}
    assert heldout_queries.main([*argv, "--split", "dev", "--out", str(out)]) == 1


@pytest.mark.parametrize(
    "flags, says",
    [
        # 20 judged training queries: 5 held out at 0.25; 0.3 holds out 6
        (["--min-queries", "6"], "raise finetune.select.fraction to 0.3 or more, or lower min_queries"),
        # 19 is the most that can be held out of 20
        (["--min-queries", "20"], "lower finetune.select.min_queries, or choose nothing"),
    ],
)
def test_too_few_heldout_queries_stop_the_split_naming_the_keys(collection, capsys, flags, says):
    out = collection / "heldout.parquet"
    argv = ["--queries", str(collection / "queries.parquet"), "--qrels", str(collection / "qrels.parquet")]
    argv += ["--split", "train", "--out", str(out), "--fraction", "0.25", *flags]
    assert heldout_queries.main(argv) == 1
    err = capsys.readouterr().err
    assert "give 5 held out (finetune.select.fraction 0.25), fewer than finetune.select.min_queries" in err
    assert says in err
    assert not out.exists()
    # the suggested fraction is enough
    argv[argv.index("0.25")] = "0.3"
    assert heldout_queries.main(argv) == (0 if "6" in flags else 1)


def test_a_choice_at_a_grid_s_edge_is_named():
    grid = [{"learning_rate": r, "epochs": e, "shared": True} for r in (1e-4, 2e-4, 4e-4) for e in (4, 8)]
    assert grid_edges(grid, {"learning_rate": 4e-4, "epochs": 4, "shared": True}) == {
        "learning_rate": "highest",
        "epochs": "lowest",
    }
    assert grid_edges(grid, {"learning_rate": 2e-4, "epochs": 8, "shared": True}) == {"epochs": "highest"}
    # one value of a setting, or none ordered, is no edge
    assert grid_edges([{"alpha": 0.5}], {"alpha": 0.5}) == {}
    assert grid_edges([{"pooling": "cls"}, {"pooling": "mean"}], {"pooling": "mean"}) == {}
    assert grid_edges([{"a": False}, {"a": True}], {"a": True}) == {}
    assert describe({"learning_rate": "highest", "epochs": "lowest"}) == (
        "at the grid's highest learning_rate and lowest epochs"
    )
    assert describe({}) == ""


def test_select_settings_picks_the_known_winner_and_weight(collection, caplog):
    out = collection / "heldout.parquet"
    heldout_queries.main(
        [
            "--queries",
            str(collection / "queries.parquet"),
            "--qrels",
            str(collection / "qrels.parquet"),
            "--split",
            "train",
            "--out",
            str(out),
            "--fraction",
            "0.25",
            "--min-queries",
            "5",
        ]
    )
    held = read_table(out, "queries").query("split == 'heldout'")["query_id"].tolist()

    # point A ranks the relevant passage 2nd for every held-out query, point B 1st; BM25 ranks it
    # 1st for the first two queries only, so fusion at a low dense weight loses
    def point_run(first):
        rows = []
        for q in held:
            right = f"p{q[1:]}"
            rows += [(q, right, 0.9), (q, "p24", 0.8)] if first else [(q, "p24", 0.9), (q, right, 0.8)]
        return run_table(rows)

    bm25 = run_table(
        [
            r
            for i, q in enumerate(held)
            for r in (
                [(q, f"p{q[1:]}", 5.0), (q, "p24", 1.0)]
                if i < 2
                else [(q, "p24", 9.0), (q, f"p{q[1:]}", 1.0)]
            )
        ]
    )
    files = []
    for name, first in (("a", False), ("b", True)):
        write_table(point_run(first), collection / f"{name}.run.parquet", "run")
        metrics = pd.DataFrame({"query_id": held, "metric": "nDCG@10", "value": 1.0 if first else 0.63})
        write_table(metrics, collection / f"{name}.metrics.parquet", "metrics")
        files.append(name)
    write_table(bm25, collection / "bm25.parquet", "run")
    (collection / "encoder.json").write_text(json.dumps({"pooling": "mean", "similarity": "cosine"}))
    grid = [{"learning_rate": 2e-5}, {"learning_rate": 5e-5}]
    selection_path = collection / "selection.json"
    code = select_settings.main(
        [
            "--grid",
            json.dumps(grid),
            "--metric",
            "nDCG@10",
            "--out",
            str(selection_path),
            "--metrics",
            *(str(collection / f"{n}.metrics.parquet") for n in files),
        ]
    )
    assert code == 0
    assert "learning_rate=5e-05 is at the grid's highest learning_rate" in caplog.text
    selection = json.loads(selection_path.read_text())
    assert selection["retriever"]["best"] == "learning_rate=5e-05"
    assert selection["retriever"]["settings"] == {"learning_rate": 5e-5}
    assert selection["retriever"]["margin"] == pytest.approx(0.37)
    assert "fusion" not in selection and "first_stage" not in selection["retriever"]

    # a reranker's grid: its own section, beside the held-out value of the run it reranked
    bm25_metrics = pd.DataFrame({"query_id": held, "metric": "nDCG@10", "value": 0.5})
    write_table(bm25_metrics, collection / "bm25.metrics.parquet", "metrics")
    reranker_path = collection / "reranker.json"
    reranker_args = ["--grid", json.dumps([{"epochs": 1}, {"epochs": 2}]), "--metric", "nDCG@10"]
    reranker_args += ["--section", "reranker", "--first-stage", str(collection / "bm25.metrics.parquet")]
    reranker_args += ["--out", str(reranker_path), "--metrics"]
    reranker_args += [str(collection / f"{n}.metrics.parquet") for n in files]
    assert select_settings.main(reranker_args) == 0
    reranker = json.loads(reranker_path.read_text())
    assert set(reranker) == {"metric", "reranker"} and reranker["reranker"]["settings"] == {"epochs": 2}
    assert reranker["reranker"]["first_stage"] == pytest.approx(0.5)
    md = compare.selections_markdown([str(selection_path), str(reranker_path)], collection)
    assert "| retriever settings | learning_rate=2e-05: 0.6300, learning_rate=5e-05: 1.0000 |" in md
    assert (
        "| reranker settings | epochs=1: 0.6300, epochs=2: 1.0000 |"
        " epochs=2 (by 0.3700; BM25 alone 0.5000; at the grid's highest epochs) |" in md
    )

    # the weight: with the chosen point's run (b), not the first point's
    fusion_args = [
        "--metric",
        "nDCG@10",
        "--runs",
        *(str(collection / f"{n}.run.parquet") for n in files),
        "--bm25-run",
        str(collection / "bm25.parquet"),
        "--queries",
        str(out),
        "--qrels",
        str(collection / "qrels.parquet"),
        "--passages",
        str(collection / "passages.parquet"),
        "--weights",
        "0.2",
        "0.8",
        "--normalizations",
        "minmax",
        "theoretical",
        "--out",
        str(collection / "fusion.json"),
    ]
    assert select_fusion.main([*fusion_args, "--selection", str(selection_path)]) == 0
    fusion = json.loads((collection / "fusion.json").read_text())
    assert fusion["dense_run"] == str(collection / "b.run.parquet")
    assert fusion["weight"] == 0.8 and fusion["dense_lower_bound"] == -1.0
    # measured from the cosine's -1, the dense run's 0.9 and 0.8 are close (1 and 0.947): BM25's
    # wrong first passage then wins 3 of 5 queries at 0.8, where min-max keeps every one right
    assert fusion["normalization"] == "minmax"
    assert fusion["weights"][3]["value"] < fusion["weights"][1]["value"] == 1.0
    assert fusion["alone"]["dense"] == pytest.approx(1.0)
    assert [(w["normalization"], w["weight"]) for w in fusion["weights"]] == [
        ("minmax", 0.2),
        ("minmax", 0.8),
        ("theoretical", 0.2),
        ("theoretical", 0.8),
    ]
    assert fusion["weights"][0]["value"] < 1.0 == fusion["value"]
    # several runs and no word on which point won: refused
    with pytest.raises(SystemExit):  # the command line's own error
        select_fusion.main(fusion_args)


# ---- what a run plans ----------------------------------------------------------------------------

SELECTION = """
finetune:
  stages: [r1, r2]
  select:
    retriever: {learning_rate: [2.0e-5, 5.0e-5]}
  fusion:
    rows: [zeroshot, r2]
methods: [none]
"""


def test_a_grid_trains_each_point_on_the_fit_part_and_the_rows_read_the_choice(tmp_path):
    commands = commands_by_rule(all_methods_plan(tmp_path, SELECTION))
    train = commands["train_retriever"]
    points = [c for c in train if "/select/" in c.split("--out ")[1].split()[0]]
    assert len(points) == 2 and len(train) == 4
    assert all("heldout_queries.parquet" in c and "--split fit" in c for c in points)
    assert any("--learning-rate 5e-05" in c for c in points) and any(
        "--learning-rate 2e-05" in c for c in points
    )
    rows = [c for c in train if c not in points]
    assert all("--selection results/" in c and "select/selection.json" in c for c in rows)
    assert all("--split train" in c for c in rows)
    (chooser,) = commands["select_settings"]
    assert "--bm25-run" not in chooser and "--weights" not in chooser
    # the weights: the grid's chosen point's, and the model off the shelf's, each a job of its own
    weighers = commands["select_fusion"]
    assert len(weighers) == 2 and sum("--selection results/" in c for c in weighers) == 1
    fused = commands["fuse"]
    assert len(fused) == 2 and all("--method convex --rrf-k 60" in c for c in fused)
    assert any("none/zeroshot/fusion.json" in c for c in fused)
    assert "--split heldout" in commands["bm25_heldout"][0]
    assert all("--eval-split heldout" in c for c in commands["search_heldout"])
    compare = commands["compare"][0]
    assert (
        "none/seed-13/r2+bm25/metrics.parquet" in compare and "none/zeroshot+bm25/metrics.parquet" in compare
    )


def test_a_negatives_grid_trains_r2_on_the_fit_part_from_the_chosen_point_s_pool(tmp_path):
    """The fit queries are searched with every retriever point and the chosen one's run mined
    (K2); each negatives' point trains r2 on the fit part from that pool and BM25's at its share,
    with the retriever's choice; the r2 row reads both choices and BM25's pool."""
    overrides = SELECTION.replace("  fusion:", "    negatives: {r2_bm25_fraction: [0.0, 0.5]}\n  fusion:")
    commands = commands_by_rule(all_methods_plan(tmp_path, overrides))
    fit = [c for c in commands["search_heldout"] if "--eval-split fit" in c]
    assert len(fit) == 2 and all("--depth 200" in c and "/fit/run.parquet" in c for c in fit)
    (pool,) = [c for c in commands["mine_negatives"] if "select/negatives.parquet" in c]
    assert (
        pool.count("/fit/run.parquet") == 2
        and "--selection results/stdlib/none/seed-13/select/selection.json" in pool
    )
    train = commands["train_retriever"]
    points = [c for c in train if "/select/r2/" in c.split("--out ")[1].split()[0]]
    assert len(points) == 2 and len(train) == 6
    for point in points:
        assert "--split fit" in point and "--role r2" in point
        assert "--negatives results/stdlib/none/seed-13/select/negatives.parquet" in point
        assert "--selection results/stdlib/none/seed-13/select/selection.json --extra-negatives" in point
    assert {c.split("--extra-fraction ")[1].split()[0] for c in points} == {"0.0", "0.5"}
    (r2,) = [c for c in train if "seed-13/r2/model" in c]
    chosen = "results/stdlib/none/seed-13/select/selection.json results/stdlib/none/seed-13/select/r2/selection.json"
    assert f"--selection {chosen}" in r2 and "--extra-negatives results/stdlib/bm25/negatives.parquet" in r2
    choosers = commands["select_settings"]
    assert len(choosers) == 2 and sum("--section negatives" in c for c in choosers) == 1
    assert "select/r2/selection.json" in commands["compare"][0]


def test_a_distillation_grid_distils_on_the_fit_part_from_a_teacher_trained_there(tmp_path):
    """Each distillation point distils on the fit part from the fit part's pool labelled by a
    reranker trained on the fit part (the settings as configured: no reranker grid), and the
    distilled row reads the choice; with a reranker grid the teacher is its chosen point."""
    overrides = "finetune:\n  stages: [r1, r2, rerank, distill]\n  select:\n    retriever: {}\n"
    overrides += "    distill: {alpha: [0.2, 1.0]}\nmethods: [none]\n"
    commands = commands_by_rule(all_methods_plan(tmp_path, overrides))
    teacher = "results/stdlib/none/seed-13/select/rerank/teacher_scores.parquet"
    points = [c for c in commands["train_retriever"] if "/select/distill/" in c.split("--out ")[1].split()[0]]
    assert len(points) == 2
    for point in points:
        assert "--split fit" in point and "--role distill" in point and f"--teacher {teacher}" in point
        assert "--negatives results/stdlib/none/seed-13/select/negatives.parquet" in point
    assert {c.split("--alpha ")[1].split()[0] for c in points} == {"0.2", "1.0"}
    (row,) = [c for c in commands["train_retriever"] if "seed-13/distill/model" in c]
    assert "--selection results/stdlib/none/seed-13/select/distill/selection.json --teacher" in row
    (fit_teacher,) = [c for c in commands["score_candidates"] if f"--out {teacher}" in c]
    assert "--model results/stdlib/none/seed-13/select/rerank/configured/model --negatives" in fit_teacher
    assert "--split fit" in fit_teacher and "--selection" not in fit_teacher
    (chooser,) = commands["select_settings"]
    assert "--section distill" in chooser
    # with a reranker grid: every point's model is given, and the choice names the teacher
    graded = overrides.replace("    distill:", "    reranker: {epochs: [1, 2]}\n    distill:")
    scorers = commands_by_rule(all_methods_plan(tmp_path / "graded", graded))["score_candidates"]
    (fit_teacher,) = [c for c in scorers if f"--out {teacher}" in c]
    assert fit_teacher.count("/select/rerank/epochs=") == 2
    assert "--selection results/stdlib/none/seed-13/select/rerank/selection.json" in fit_teacher


def test_a_reranker_grid_trains_on_the_fit_part_and_reranks_bm25s_heldout_run(tmp_path):
    """Each point trains on the fit part's BM25 negatives and reranks BM25's held-out run (no model
    that read a held-out query is in its path); the reranker row reads the choice; nothing of it
    where no stage trains a reranker."""
    overrides = "finetune:\n  stages: [r1, r2, rerank]\n  select:\n    retriever: {}\n"
    overrides += "    reranker: {learning_rate: [2.0e-5, 1.0e-4]}\nmethods: [none]\n"
    commands = commands_by_rule(all_methods_plan(tmp_path, overrides))
    train = commands["train_reranker"]
    points = [c for c in train if "/select/rerank/" in c.split("--out ")[1].split()[0]]
    assert len(points) == 2 and len(train) == 3
    for point in points:
        assert "heldout_queries.parquet --qrels" in point and "--split fit" in point
        assert "--negatives results/stdlib/bm25/negatives.parquet" in point and "--selection" not in point
    assert {c.split("--learning-rate ")[1].split()[0] for c in points} == {"2e-05", "0.0001"}
    (row,) = [c for c in train if c not in points]
    assert "--split train" in row and "seed-13/r2/negatives.parquet" in row
    assert "--selection results/stdlib/none/seed-13/select/rerank/selection.json" in row
    reranked = [c for c in commands["rerank"] if "/select/rerank/" in c]
    assert len(reranked) == 2
    assert all("--run results/stdlib/bm25/heldout/run.parquet" in c for c in reranked)
    assert all("heldout_queries.parquet" in c for c in reranked)
    (chooser,) = commands["select_settings"]
    assert "--section reranker --first-stage results/stdlib/bm25/heldout/metrics.parquet" in chooser
    assert "select/rerank/selection.json" in commands["compare"][0]
    # no stage trains a reranker: the grid plans nothing
    quiet = commands_by_rule(all_methods_plan(tmp_path / "r2", overrides.replace(", rerank]", "]")))
    assert "train_reranker" not in quiet and "select_settings" not in quiet


def test_one_choice_serves_every_seed_when_per_seed_is_false(tmp_path):
    """seeds [13, 14] with finetune.select.per_seed false: the grid trains under seed 13 only, and
    seed 14's r1 and r2 read seed 13's choice (issue 54: the grids' cost paid once)."""
    overrides = SELECTION.replace("methods: [none]", "methods: [none]\nseeds: [13, 14]")
    shared = overrides.replace("  fusion:", "    per_seed: false\n  fusion:")
    train = commands_by_rule(all_methods_plan(tmp_path, shared))["train_retriever"]
    points = [c for c in train if "/select/" in c.split("--out ")[1].split()[0]]
    assert len(points) == 2 and all("/seed-13/select/" in c for c in points)
    rows = [c for c in train if c not in points]
    assert len(rows) == 4 and all(
        "--selection results/stdlib/none/seed-13/select/selection.json" in c for c in rows
    )
    # each seed its own (the default): four points
    own = commands_by_rule(all_methods_plan(tmp_path / "own", overrides))["train_retriever"]
    assert len([c for c in own if "/select/" in c.split("--out ")[1].split()[0]]) == 4


def test_one_method_chooses_for_every_method_with_select_by(tmp_path):
    """finetune.select.by none, per_seed false, seeds_of giving none's retriever 1 and every row of
    cocondenser three seeds (issue 54's design): the grid trains under none's seed 13 only; every
    row of both methods reads that choice, and cocondenser's fused rows none's fusion.json."""
    overrides = SELECTION.replace("methods: [none]", "methods: [none, cocondenser]")
    overrides = overrides.replace("  fusion:", "    by: none\n    per_seed: false\n  fusion:")
    overrides += "seeds_of: {none/r1: [13, 14, 15], cocondenser: [13, 14, 15]}\n"
    commands = commands_by_rule(all_methods_plan(tmp_path, overrides))
    train = commands["train_retriever"]
    points = [c for c in train if "/select/" in c.split("--out ")[1].split()[0]]
    assert len(points) == 2 and all("/none/seed-13/select/" in c for c in points)
    rows = [c for c in train if c not in points]
    # none: r1 of seeds 13-15 and r2 of seed 13; cocondenser: r1 and r2 of each seed
    assert len(rows) == 4 + 6 and all(
        "--selection results/stdlib/none/seed-13/select/selection.json" in c for c in rows
    )
    assert len(commands["export_model"]) == 10 and len(commands["nb_recall"]) == 1 + 3
    fused = [c for c in commands["fuse"] if "/cocondenser/seed-" in c]
    assert len(fused) == 3 and all(
        "--fusion results/stdlib/none/seed-13/select/fusion.json" in c for c in fused
    )
    # the weights of the model off the shelf and of none's trained rows (cocondenser has no zeroshot row)
    assert len(commands["select_fusion"]) == 2


# ---- the config check ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("finetune.select.retriever", {"dropout": [0.1]}, "dropout"),
        ("finetune.select.retriever", {"learning_rate": []}, "finetune.select.retriever.learning_rate"),
        ("finetune.select.retriever", {"learning_rate": [0.0]}, "finetune.select.retriever.learning_rate"),
        ("finetune.select.retriever", {"epochs": [1.5]}, "finetune.select.retriever.epochs"),
        ("finetune.select.reranker", {"temperature": [0.05]}, "temperature"),
        ("finetune.select.distill", {"direction": ["teacher_student"]}, "direction"),
        (
            "finetune.select.negatives",
            {"r2_bm25_fraction": [1.5]},
            "finetune.select.negatives.r2_bm25_fraction",
        ),
        ("finetune.select.reranker", {"group_size": [1]}, "finetune.select.reranker.group_size"),
        ("finetune.select.fraction", 1.0, "finetune.select.fraction"),
        ("finetune.select.metric", "nDCG@ten", "finetune.select.metric = 'nDCG@ten'"),
        ("finetune.fusion.rows", ["rerank"], "finetune.fusion.rows"),
        ("finetune.fusion.weights", [1.5], "finetune.fusion.weights"),
        ("finetune.fusion.method", "sum", "finetune.fusion.method"),
        ("finetune.select.by", "cdmae", "finetune.select.by: 'cdmae' is not one of the config's methods"),
        ("seeds_of", {"cdmae": [13, 14]}, "seeds_of.cdmae: 'cdmae' is not one of the config's methods"),
        ("seeds_of", {"none": []}, "seeds_of"),
        ("seeds_of", {"none/r3": [1]}, "seeds_of"),
        ("seeds_of", {"none/rerank": [1, 2]}, "seeds_of.none/rerank: none fine-tunes no 'rerank' row"),
    ],
)
def test_bad_selection_settings_are_refused_naming_the_key(key, value, message):
    from config_edits import config_problems, set_key

    assert message in config_problems(set_key(key, value))


def test_a_fused_row_without_a_grid_trains_one_point_for_its_weight(tmp_path):
    """An empty grid chooses nothing: r1 trains as configured (no --selection), and the fused
    r1+bm25 row's weight comes from the configured settings trained on the fit part."""
    plan = all_methods_plan(tmp_path, "finetune: {stages: [r1], fusion: {rows: [r1]}}\nmethods: [none]\n")
    train = commands_by_rule(plan)["train_retriever"]
    (point,) = [c for c in train if "/select/configured/model" in c]
    (row,) = [c for c in train if "/seed-13/r1/model" in c]
    assert "--split fit" in point and "--selection" not in row and "--selection" not in point
    (fused,) = commands_by_rule(plan)["fuse"]
    assert "--fusion results/" in fused and "seed-13/select/fusion.json" in fused
    (weigher,) = commands_by_rule(plan)["select_fusion"]
    assert "select/configured/heldout/run.parquet" in weigher and "--selection" not in weigher
    assert "select_settings" not in commands_by_rule(plan)


@pytest.mark.parametrize(
    ("rows", "grid_weighs", "zeroshot_chooses"),
    [("[]", False, False), ("[zeroshot]", False, True), ("[r2]", True, False)],
)
def test_a_fusion_weight_is_chosen_only_where_a_fused_row_reads_it(
    tmp_path, rows, grid_weighs, zeroshot_chooses
):
    """Without a fused row nothing reads a weight, so none is chosen and BM25's held-out run is not
    read (before: every selection chose one, through pyserini, also with `fusion.rows: []`). The
    weight is a job of its own (select_fusion): the grid's choice reads no BM25 run."""
    overrides = SELECTION.replace("rows: [zeroshot, r2]", f"rows: {rows}")
    commands = commands_by_rule(all_methods_plan(tmp_path, overrides))
    (grid,) = commands["select_settings"]
    assert "--bm25-run" not in grid
    weighers = commands.get("select_fusion", [])
    assert any("seed-13/select/fusion.json" in c for c in weighers) == grid_weighs
    assert any("none/zeroshot/fusion.json" in c for c in weighers) == zeroshot_chooses
    assert len(weighers) == grid_weighs + zeroshot_chooses
    assert ("bm25_heldout" in commands) == (grid_weighs or zeroshot_chooses)
