"""Tests of the BEIR-layout loader: exact tables on a tiny folder, one test per kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dprflow.data.collections.beir import CollectionError, load_beir
from dprflow.data.schemas import read_table, write_table

ROOT = Path(__file__).resolve().parents[1]

HEADER = "query-id\tcorpus-id\tscore\n"


def jl(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


CORPUS = jl(
    {"_id": "d1", "title": "Alpha", "text": "alpha text"},
    {"_id": 2, "text": "no title here"},  # integer id -> "2", missing title -> ""
    {"_id": "d3", "title": "", "text": ""},  # empty: kept and counted
    {"_id": "d4", "title": None, "text": "null title"},
)
QUERIES = jl(
    {"_id": "q1", "text": "first query", "metadata": {"x": 1}},
    {"_id": "q2", "text": "second query"},
    {"_id": "q3", "text": ""},  # empty: kept and counted
    {"_id": "q4", "text": "never judged"},
)
TRAIN = HEADER + "q1\td1\t2\nq1\t2\t0\nq1\td1\t2\n"  # score 0 kept; exact duplicate dropped and counted
DEV = HEADER + "q3\td4\t1\n"
TEST = HEADER + "q2\td3\t1\nq2\td4\t-1\n"


def make(tmp_path: Path, **files: str | bytes | None) -> Path:
    """Write a BEIR folder; keyword names: corpus, queries, train, dev, test (None leaves it out)."""
    content = {"corpus": CORPUS, "queries": QUERIES, "train": TRAIN, "dev": DEV, "test": TEST} | files
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    paths = {"corpus": "corpus.jsonl", "queries": "queries.jsonl"} | {
        s: f"qrels/{s}.tsv" for s in ("train", "dev", "test")
    }
    for key, data in content.items():
        if data is None:
            continue
        path = folder / paths[key]
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8", newline="")
    return folder


def test_tiny_folder_loads_exact_tables(tmp_path):
    c = load_beir(make(tmp_path))
    assert c.documents.to_dict("records") == [
        {"doc_id": "d1", "title": "Alpha", "text": "alpha text"},
        {"doc_id": "2", "title": "", "text": "no title here"},
        {"doc_id": "d3", "title": "", "text": ""},
        {"doc_id": "d4", "title": "", "text": "null title"},
    ]
    assert c.queries.to_dict("records") == [
        {"query_id": "q1", "text": "first query", "split": "train"},
        {"query_id": "q2", "text": "second query", "split": "test"},
        {"query_id": "q3", "text": "", "split": "dev"},
        {"query_id": "q4", "text": "never judged", "split": "unjudged"},
    ]
    assert c.qrels.to_dict("records") == [
        {"query_id": "q1", "doc_id": "d1", "relevance": 2},
        {"query_id": "q1", "doc_id": "2", "relevance": 0},
        {"query_id": "q3", "doc_id": "d4", "relevance": 1},
        {"query_id": "q2", "doc_id": "d3", "relevance": 1},
        {"query_id": "q2", "doc_id": "d4", "relevance": -1},
    ]
    assert str(c.qrels["relevance"].dtype) == "int32"
    assert c.counts == {
        "documents": 4,
        "documents_empty": 1,
        "queries": 4,
        "queries_empty": 1,
        "queries_unjudged": 1,
        "queries_train": 1,
        "queries_dev": 1,
        "queries_test": 1,
        "queries_without_relevant": 0,
        "qrels": 5,
        "qrels_nonpositive": 2,
        "qrels_duplicate": 1,
    }


def test_tables_match_the_schemas(tmp_path):
    c = load_beir(make(tmp_path))
    for name in ("documents", "queries", "qrels"):
        path = write_table(getattr(c, name), tmp_path / f"{name}.parquet", name)
        back = read_table(path, name)
        assert back.to_dict("records") == getattr(c, name).to_dict("records")


def test_subset_of_qrels_files_and_query_without_relevant(tmp_path):
    c = load_beir(make(tmp_path, train=None, dev=None, test=HEADER + "q2\td1\t0\n"))
    assert set(c.queries["split"]) == {"test", "unjudged"}
    assert "queries_train" not in c.counts and c.counts["queries_test"] == 1
    assert c.counts["queries_without_relevant"] == 1
    assert c.counts["queries_unjudged"] == 3


def test_crlf_bom_and_blank_lines_are_tolerated(tmp_path):
    corpus = "\ufeff" + CORPUS.replace("\n", "\r\n") + "\n   \n"
    c = load_beir(make(tmp_path, corpus=corpus, train=TRAIN.replace("\n", "\r\n")))
    assert c.documents["doc_id"].tolist() == ["d1", "2", "d3", "d4"]
    assert c.documents["text"].iloc[0] == "alpha text"
    assert c.counts["qrels"] == 5


def test_blank_lines_do_not_shift_line_numbers(tmp_path):
    corpus = CORPUS + "\n\n" + "{not json}\n"  # 4 good lines, 2 blank, the bad one is line 7
    with pytest.raises(CollectionError, match=r"corpus\.jsonl:7: malformed JSON"):
        load_beir(make(tmp_path, corpus=corpus))


BAD = {
    "invalid-utf8": (
        {"corpus": CORPUS.encode() + b'{"_id": "d5", "text": "caf\xe9"}\n'},
        ["corpus.jsonl:5:", "invalid UTF-8", "re-encode"],
    ),
    "malformed-json": (
        {"queries": QUERIES.replace('"second query"}', '"second query"')},
        ["queries.jsonl:2:", "malformed JSON"],
    ),
    "not-an-object": ({"queries": QUERIES + "[1, 2]\n"}, ["queries.jsonl:5:", "JSON object"]),
    "missing-id": ({"corpus": CORPUS + jl({"text": "x"})}, ["corpus.jsonl:5:", "'_id'"]),
    "missing-text": ({"queries": jl({"_id": "q1"}) + QUERIES}, ["queries.jsonl:1:", "'text'"]),
    "float-id": ({"corpus": jl({"_id": 1.5, "text": "x"}) + CORPUS}, ["corpus.jsonl:1:", "must be a string"]),
    "bool-id": (
        {"queries": QUERIES + jl({"_id": True, "text": "x"})},
        ["queries.jsonl:5:", "must be a string"],
    ),
    "empty-id": ({"corpus": CORPUS + jl({"_id": "", "text": "x"})}, ["corpus.jsonl:5:", "empty"]),
    "non-string-text": (
        {"corpus": CORPUS + jl({"_id": "d9", "text": 7})},
        ["corpus.jsonl:5:", "'text'", "string"],
    ),
    "non-string-title": (
        {"corpus": CORPUS + jl({"_id": "d9", "title": ["a"], "text": "x"})},
        ["corpus.jsonl:5:", "'title'"],
    ),
    "duplicate-doc-id": (
        {"corpus": CORPUS + jl({"_id": "d3", "text": "again"})},
        ["corpus.jsonl:5:", "duplicate _id 'd3'", "first at line 3"],
    ),
    "duplicate-query-id": (
        {"queries": QUERIES + jl({"_id": "q2", "text": "again"})},
        ["queries.jsonl:5:", "duplicate _id 'q2'", "first at line 2"],
    ),
    "wrong-column-count": (
        {"train": TRAIN + "q1\td4\n"},
        ["train.tsv:5:", "3 tab-separated columns", "got 2"],
    ),
    "space-separated": ({"dev": DEV + "q3 d1 1\n"}, ["dev.tsv:3:", "got 1"]),
    "non-integer-score": ({"test": TEST + "q2\td1\t1.0\n"}, ["test.tsv:4:", "'1.0' is not an integer"]),
    "header-missing": ({"dev": "q3\td4\t1\n"}, ["dev.tsv:1:", "header line is missing"]),
    "header-wrong": ({"dev": "qid\tdocid\trel\nq3\td4\t1\n"}, ["dev.tsv:1:", "unexpected header"]),
    "empty-qrels-file": ({"dev": ""}, ["dev.tsv", "empty"]),
    "unknown-document": (
        {"test": TEST + "q2\tnope\t1\n"},
        ["test.tsv:4:", "corpus-id 'nope'", "corpus.jsonl"],
    ),
    "unknown-query": ({"train": HEADER + "q9\td1\t1\n"}, ["train.tsv:2:", "query-id 'q9'", "queries.jsonl"]),
    "conflicting-duplicate-qrel": (
        {"train": HEADER + "q1\td1\t2\nq1\td4\t1\nq1\td1\t1\n"},
        ["train.tsv:4:", "train.tsv:2", "judged 1 here but 2"],
    ),
    "query-in-two-splits": (
        {"test": TEST + "q1\td4\t1\n"},
        ["test.tsv:4:", "'test'", "'train'", "train.tsv:2"],
    ),
    "no-qrels": ({"train": None, "dev": None, "test": None}, ["qrels", "no qrels file", "train.tsv"]),
    "no-documents": ({"corpus": "\n"}, ["corpus.jsonl", "no documents"]),
}


@pytest.mark.parametrize("files, expected", list(BAD.values()), ids=list(BAD))
def test_bad_input_names_file_and_line(tmp_path, files, expected):
    with pytest.raises(CollectionError) as info:
        load_beir(make(tmp_path, **files))
    message = str(info.value)
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"
    assert "; " in message  # every message goes on to say what would fix it


def test_missing_files_are_named(tmp_path):
    with pytest.raises(CollectionError, match="queries.jsonl: missing"):
        load_beir(make(tmp_path, queries=None))
    with pytest.raises(CollectionError, match="no such folder"):
        load_beir(tmp_path / "nowhere")


def test_collection_error_is_a_value_error():
    assert issubclass(CollectionError, ValueError)


def test_the_collections_check_compares_what_the_loader_reads(tmp_path, capsys):
    """scripts/check_collections.py (the real collections' figures, run by hand): OK for each
    figure the loader reads as expected, FAIL and exit 1 for one it does not, a missing collection
    passed over."""
    import runpy

    script = runpy.run_path(str(ROOT / "scripts" / "check_collections.py"))
    folder = make(tmp_path)
    tiny = {
        "documents": 4,
        "documents_empty": 1,
        "queries_test": 1,
        "qrels": 5,
        "relevance levels": [-1, 0, 1, 2],
    }
    assert [ok for _, ok, _ in script["check"](folder, tiny)] == [True] * 5
    assert script["check"](folder, {**tiny, "qrels": 6})[3] == ("qrels", False, "5 (expected 6)")

    root = tmp_path / "collections"
    root.mkdir()
    folder.rename(root / "cisi")  # checked against CISI's figures: not these
    assert script["main"]([str(root)]) == 1
    out = capsys.readouterr().out
    assert "cranfield: not in" in out and "cisi documents: FAIL 4 (expected 1460)" in out
