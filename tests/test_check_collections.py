"""Tests of scripts/check_collections.py, the hand-run check of the real collections: every way it
could check nothing and still pass (a mistyped root, a file gone) fails, and a collection the loader
cannot read is a FAIL line naming the file, after which the next collection is still checked.

The script's EXPECTED is swapped for three tiny collections written in tmp_path (the tests never
read ../shared)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One judged query a split, each judging one document with grade 1.
TINY = {
    "documents": 2,
    "documents_empty": 0,
    "queries_train": 1,
    "queries_test": 1,
    "queries_unjudged": 0,
    "qrels": 2,
    "relevance levels": [1],
}
NAMES = ("alpha", "beta", "gamma")
FILES = {
    "corpus.jsonl": "".join(
        json.dumps({"_id": d, "title": "", "text": f"text of {d}"}) + "\n" for d in ("d1", "d2")
    ),
    "queries.jsonl": "".join(json.dumps({"_id": q, "text": f"query {q}"}) + "\n" for q in ("q1", "q2")),
    "qrels/train.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\n",
    "qrels/test.tsv": "query-id\tcorpus-id\tscore\nq2\td2\t1\n",
}


@pytest.fixture
def script(monkeypatch):
    """The script as a module, expecting TINY of each of NAMES."""
    spec = importlib.util.spec_from_file_location(
        "check_collections", ROOT / "scripts" / "check_collections.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "EXPECTED", {name: TINY for name in NAMES})
    return module


def make_root(tmp_path: Path, names=NAMES) -> Path:
    """A root holding a tiny, readable collection under each of ``names``."""
    root = tmp_path / "collections"
    for name in names:
        for rel, text in FILES.items():
            path = root / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    root.mkdir(exist_ok=True)
    return root


def test_readable_collections_pass(script, tmp_path, capsys):
    assert script.main([str(make_root(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert out.count(": OK ") == 21 and "FAIL" not in out
    assert "21 of 21 figures OK (3 of 3 collections present)" in out


def test_an_absent_collection_is_passed_over_when_another_is_checked(script, tmp_path, capsys):
    assert script.main([str(make_root(tmp_path, names=["beta"]))]) == 0
    out = capsys.readouterr().out
    assert "alpha: not in" in out and "gamma: not in" in out
    assert out.count("beta ") == 7 and "7 of 7 figures OK (1 of 3 collections present)" in out


def test_a_root_that_does_not_exist_is_an_error(script, tmp_path, capsys):
    """It printed 'passed over' for each collection and exited 0."""
    root = tmp_path / "colections"
    assert script.main([str(root)]) == 2
    captured = capsys.readouterr()
    assert f"{root}: no such folder" in captured.err
    assert "passed over" not in captured.out


def test_a_root_holding_none_of_the_collections_is_an_error(script, tmp_path, capsys):
    root = make_root(tmp_path, names=["other"])
    assert script.main([str(root)]) == 2
    captured = capsys.readouterr()
    assert f"{root} holds none of alpha, beta, gamma, so nothing was checked" in captured.err


@pytest.mark.parametrize("missing", ["corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"])
def test_a_missing_file_is_a_fail_naming_it(script, tmp_path, capsys, missing):
    """A missing corpus was a collection passed over (exit 0), missing queries a traceback, a
    missing qrels file 'queries_test: FAIL None'."""
    root = make_root(tmp_path)
    (root / "beta" / missing).unlink()
    assert script.main([str(root)]) == 1
    out = capsys.readouterr().out
    assert f"beta: FAIL missing {root / 'beta' / missing};" in out
    assert "None" not in out and "passed over" not in out
    assert out.count("gamma ") == 7 and "14 of 21 figures OK" in out  # the next one still checked


@pytest.mark.parametrize(
    ("file", "content", "where"),
    [
        (
            "queries.jsonl",
            b'{"_id": "q1", "text": "one"}\n{"_id": "q2", "text": \n',
            "queries.jsonl:2: malformed JSON",
        ),
        (
            "corpus.jsonl",
            FILES["corpus.jsonl"].encode() + b'{"_id": "d3", "text": "caf\xe9"}\n',
            "corpus.jsonl:3: invalid UTF-8",
        ),
        ("queries.jsonl", b"", "queries.jsonl: no queries"),
    ],
    ids=["malformed-json", "not-utf8", "empty-queries"],
)
def test_an_unreadable_collection_is_a_fail_and_the_next_is_checked(
    script, tmp_path, capsys, file, content, where
):
    """Each ended the whole check in a traceback, the later collections never checked."""
    root = make_root(tmp_path)
    (root / "beta" / file).write_bytes(content)
    assert script.main([str(root)]) == 1
    out = capsys.readouterr().out
    assert f"beta: FAIL {root / 'beta' / where}" in out
    assert out.count("alpha ") == 7 and out.count("gamma ") == 7 and "14 of 21 figures OK" in out
