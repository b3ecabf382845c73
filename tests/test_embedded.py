"""Tests of the standard-library docstring collection, on a small fake stdlib and once on the real one."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from pathlib import Path

import pytest

from dprflow.data.collections.embedded import (
    COUNT_KEYS,
    build_embedded,
    query_id_for,
    split_for,
    split_summary,
    stdlib_version,
)
from dprflow.data.schemas import read_table, write_table

BOMB = '''
"""A module that must never be imported: importing it leaves a marker and exits."""
import pathlib

pathlib.Path(__file__).with_name("IMPORTED").write_text("imported")
raise SystemExit("dprflow_fake_bomb was imported")


def add(a, b):
    """Add two numbers together.

    Both arguments must be numbers of a compatible type, or this raises TypeError.
    """


def one_liner():
    """Do a tiny thing here and nothing else."""


def tiny():
    """Tiny thing.

    This body has more than eight words in it, so only the summary is short.
    """


def _hidden():
    """Hidden helper function here.

    This one is private and must be skipped by the loader, whatever it says.
    """


def undocumented():
    return 1


class Outer:
    """Hold an inner class for nesting.

    Outer is a container whose only purpose is to nest another class inside.
    """

    class Inner:
        def method(self):
            """Compute the inner value carefully.



            The inner method of the nested class returns a value   computed with care.
                Indented lines keep their indentation.
            """

        def __repr__(self):
            """Return the representation of self.

            Dunder methods are private names and are skipped like the others.
            """

    def outer_method(self):
        """Convert the value to text. The rest of this first paragraph
        is not the summary, e.g. this part is the text.

        A second paragraph follows.
        """

        def local():
            """Local helper that is never a document.

            Functions defined in function bodies are counted as local, nothing more.
            """


if sys.platform == "win32":

    def platform_name():
        """Name the current platform family.

        The first definition, in file order, is the one that is kept as the document.
        """

else:

    def platform_name():
        """Name the current platform family.

        The second definition is a duplicate of the dotted name and is dropped.
        """
'''

BETA = '''
def to_string(x):
    """Return str(self) of the object.

    The first of two functions that share one summary: its query is ambiguous.
    """


def to_text(x):
    """Return  STR(self) of the object.

    The second of two functions that share one summary, up to case and spaces.
    """


def dup():
    """dup() -> socket object

    Duplicate the socket object now. Return a new socket object that shares the descriptor.
    """


async def fetch(url):
    """Fetch a resource asynchronously.

    Coroutines are functions too, and their docstrings are documents like any other.
    """
'''

PKG_INIT = '''
def init_func():
    """Initialise the package state once.

    Called by the package itself on first use; calling it again does nothing at all.
    """
'''

PKG_SUB = '''
try:
    import zlib
except ImportError:
    zlib = None
else:

    class Thing:
        """Represent a thing inside a try statement.

        Definitions in try/else blocks belong to the module namespace like any other.
        """
'''

DOCUMENTED_ELSEWHERE = '''
def ignored():
    """This function lives somewhere that is skipped.

    So it never becomes a document, whatever the length of its docstring may be.
    """
'''

EXPECTED_IDS = [
    "beta.dup",
    "beta.fetch",
    "beta.to_string",
    "beta.to_text",
    "dprflow_fake_bomb.Outer",
    "dprflow_fake_bomb.Outer.Inner.method",
    "dprflow_fake_bomb.Outer.outer_method",
    "dprflow_fake_bomb.add",
    "dprflow_fake_bomb.platform_name",
    "pkg.init_func",
    "pkg.sub.Thing",
]


@pytest.fixture
def fake_stdlib(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    files = {
        "dprflow_fake_bomb.py": BOMB,
        "beta.py": BETA,
        "pkg/__init__.py": PKG_INIT,
        "pkg/sub.py": PKG_SUB,
        "pkg/_private.py": DOCUMENTED_ELSEWHERE,  # private module
        "pkg/__main__.py": DOCUMENTED_ELSEWHERE,  # private module too
        "test/test_beta.py": DOCUMENTED_ELSEWHERE,  # test suite
        "pkg/tests/test_sub.py": DOCUMENTED_ELSEWHERE,  # nested test suite
        "site-packages/thirdparty.py": DOCUMENTED_ELSEWHERE,  # not the stdlib
        "idlelib/editor.py": DOCUMENTED_ELSEWHERE,  # skip list
        "broken.py": "def f(:\n    pass\n",  # syntax error
        "notes.txt": "not python",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    # Valid Python for its own declared encoding, but not UTF-8: skipped as unparsable.
    (root / "latin.py").write_bytes(b'# -*- coding: latin-1 -*-\ndef f():\n    """Caf\xe9 au lait."""\n')
    return root


def test_documents_ids_titles_and_texts(fake_stdlib: Path) -> None:
    c = build_embedded(stdlib_dir=fake_stdlib)
    docs = c.documents.set_index("doc_id")
    assert list(c.documents["doc_id"]) == EXPECTED_IDS
    assert list(c.documents.columns) == ["doc_id", "title", "text"]
    assert (c.documents["title"] == c.documents["doc_id"]).all()
    assert docs.loc["dprflow_fake_bomb.add", "text"] == (
        "Both arguments must be numbers of a compatible type, or this raises TypeError."
    )
    # Blank lines collapsed, inner runs of spaces collapsed, indentation kept.
    assert docs.loc["dprflow_fake_bomb.Outer.Inner.method", "text"] == (
        "The inner method of the nested class returns a value computed with care.\n"
        "    Indented lines keep their indentation."
    )
    # Cut at the first sentence; "e.g." does not end one.
    assert docs.loc["dprflow_fake_bomb.Outer.outer_method", "text"] == (
        "The rest of this first paragraph\nis not the summary, e.g. this part is the text.\n\n"
        "A second paragraph follows."
    )
    # The first of two definitions of one name.
    assert docs.loc["dprflow_fake_bomb.platform_name", "text"].startswith("The first definition")
    # The signature line is dropped; the summary is the first sentence after it.
    assert docs.loc["beta.dup", "text"] == "Return a new socket object that shares the descriptor."
    assert not any("summary" in t and "Add two" in t for t in c.documents["text"])


def test_queries_are_summaries_with_one_qrel_each(fake_stdlib: Path) -> None:
    c = build_embedded(stdlib_dir=fake_stdlib)
    by_doc = c.qrels.merge(c.queries, on="query_id").set_index("doc_id")["text"]
    assert by_doc.to_dict() == {
        "beta.dup": "Duplicate the socket object now.",
        "beta.fetch": "Fetch a resource asynchronously.",
        "dprflow_fake_bomb.Outer": "Hold an inner class for nesting.",
        "dprflow_fake_bomb.Outer.Inner.method": "Compute the inner value carefully.",
        "dprflow_fake_bomb.Outer.outer_method": "Convert the value to text.",
        "dprflow_fake_bomb.add": "Add two numbers together.",
        "dprflow_fake_bomb.platform_name": "Name the current platform family.",
        "pkg.init_func": "Initialise the package state once.",
        "pkg.sub.Thing": "Represent a thing inside a try statement.",
    }
    assert list(c.queries.columns) == ["query_id", "text", "split"]
    assert list(c.qrels.columns) == ["query_id", "doc_id", "relevance"]
    assert str(c.qrels["relevance"].dtype) == "int32" and (c.qrels["relevance"] == 1).all()
    assert c.qrels["query_id"].is_unique and set(c.qrels["query_id"]) == set(c.queries["query_id"])
    for _, row in c.qrels.iterrows():
        assert row.query_id == "q" + hashlib.sha1(row.doc_id.encode()).hexdigest()[:12]


def test_ambiguous_summaries_drop_queries_but_keep_documents(fake_stdlib: Path) -> None:
    c = build_embedded(stdlib_dir=fake_stdlib)
    assert {"beta.to_string", "beta.to_text"} <= set(c.documents["doc_id"])
    assert not {"beta.to_string", "beta.to_text"} & set(c.qrels["doc_id"])
    assert c.counts["queries_ambiguous_summary"] == 2
    # The twin docstrings of an if/else duplicate are not ambiguous: the duplicate went first.
    assert "dprflow_fake_bomb.platform_name" in set(c.qrels["doc_id"])


def test_skip_counts(fake_stdlib: Path) -> None:
    c = build_embedded(stdlib_dir=fake_stdlib)
    assert list(c.counts) == list(COUNT_KEYS)
    assert all(isinstance(v, int) for v in c.counts.values())
    assert c.counts == {
        "directories_skipped": 4,  # test, site-packages, idlelib, pkg/tests
        "files_not_module": 0,
        "files_private_module": 2,  # pkg/_private.py, pkg/__main__.py
        "files_unparsable": 2,  # broken.py (syntax), latin.py (not UTF-8)
        "modules_parsed": 4,  # beta, dprflow_fake_bomb, pkg, pkg.sub
        "objects_undocumented": 2,  # undocumented, Outer.Inner
        "objects_local": 1,  # outer_method.local
        "objects_private": 2,  # _hidden, Inner.__repr__
        "objects_short_summary": 1,  # tiny
        "objects_short_text": 1,  # one_liner
        "summaries_cut_at_sentence": 2,  # outer_method, dup
        "summaries_after_signature": 1,  # dup
        "documents_duplicate_id": 1,  # platform_name
        "queries_ambiguous_summary": 2,
        "documents_over_cap": 0,
        "documents": 11,
        "queries": 9,
        "queries_train": c.counts["queries_train"],
        "queries_dev": c.counts["queries_dev"],
        "queries_test": c.counts["queries_test"],
    }
    assert c.counts["queries_train"] + c.counts["queries_dev"] + c.counts["queries_test"] == 9


def test_modules_are_parsed_never_imported(fake_stdlib: Path) -> None:
    c = build_embedded(stdlib_dir=fake_stdlib)
    assert "dprflow_fake_bomb.add" in set(c.documents["doc_id"])
    assert "dprflow_fake_bomb" not in sys.modules
    assert not (fake_stdlib / "IMPORTED").exists()


def test_splits_follow_the_query_id_hash(fake_stdlib: Path) -> None:
    c = build_embedded(stdlib_dir=fake_stdlib)
    for _, row in c.queries.iterrows():
        bucket = int(hashlib.sha1(row.query_id.encode()).hexdigest(), 16) % 100
        assert row.split == ("train" if bucket < 80 else "dev" if bucket < 90 else "test")
    ids = [f"q{i:012x}" for i in range(5000)]
    shares = {s: sum(split_for(q) == s for q in ids) / len(ids) for s in ("train", "dev", "test")}
    assert abs(shares["train"] - 0.8) < 0.03 and abs(shares["dev"] - 0.1) < 0.02
    assert query_id_for("json.dumps") == "qd8214d520ff6"
    # Other shares move queries between splits by the same hash: a test query stays test when
    # the test share grows.
    wide = build_embedded(stdlib_dir=fake_stdlib, split_percent=(50, 10, 40))
    for _, row in wide.queries.iterrows():
        bucket = int(hashlib.sha1(row.query_id.encode()).hexdigest(), 16) % 100
        assert row.split == ("train" if bucket < 50 else "dev" if bucket < 60 else "test")
    with pytest.raises(ValueError, match="summing to 100"):
        build_embedded(stdlib_dir=fake_stdlib, split_percent=(50, 10, 10))


def test_deterministic_down_to_the_bytes(fake_stdlib: Path, tmp_path: Path) -> None:
    first, second = build_embedded(stdlib_dir=fake_stdlib), build_embedded(stdlib_dir=fake_stdlib)
    for name in ("documents", "queries", "qrels"):
        a = write_table(getattr(first, name), tmp_path / f"a_{name}.parquet", name)
        b = write_table(getattr(second, name), tmp_path / f"b_{name}.parquet", name)
        assert a.read_bytes() == b.read_bytes()
        assert read_table(a, name).equals(getattr(first, name))
    assert first.counts == second.counts
    assert list(first.queries["query_id"]) == sorted(first.queries["query_id"])


def test_max_documents_keeps_a_stable_subset(fake_stdlib: Path) -> None:
    full = build_embedded(stdlib_dir=fake_stdlib)
    by_hash = sorted(full.documents["doc_id"], key=lambda d: hashlib.sha1(d.encode()).hexdigest())
    previous: set[str] = set()
    for cap in (1, 3, 6, 10):
        c = build_embedded(max_documents=cap, stdlib_dir=fake_stdlib)
        kept = set(c.documents["doc_id"])
        assert kept == set(by_hash[:cap])
        assert previous <= kept
        previous = kept
        assert set(c.qrels["doc_id"]) == kept & set(full.qrels["doc_id"])  # ambiguity ignores the cap
        assert set(c.queries["query_id"]) == set(c.qrels["query_id"])
        assert c.counts["documents_over_cap"] == len(full.documents) - cap
        assert c.counts["queries_ambiguous_summary"] == 2
        sub = full.queries[full.queries["query_id"].isin(c.queries["query_id"])].reset_index(drop=True)
        assert sub.equals(c.queries)  # same ids, texts and splits as without the cap
    assert build_embedded(max_documents=100, stdlib_dir=fake_stdlib).documents.equals(full.documents)


def test_bad_arguments(fake_stdlib: Path) -> None:
    with pytest.raises(ValueError, match="max_documents"):
        build_embedded(max_documents=0, stdlib_dir=fake_stdlib)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        build_embedded(stdlib_dir=fake_stdlib / "missing")


@pytest.mark.parametrize(
    ("docstring", "summary", "text"),
    [
        (
            "Return the sum\nof two numbers.\n\nBoth must be numbers.",
            "Return the sum of two numbers.",
            "Both must be numbers.",
        ),
        ("Use a codec, e.g. UTF-8. Then more.", "Use a codec, e.g. UTF-8.", "Then more."),
        ("Return the value:\n>>> f()\n1", "Return the value:", ">>> f()\n1"),
        (">>> f()\n1\n\nAn example first.", "", ">>> f()\n1\n\nAn example first."),
        ("w(here)\nPrint a stack trace.", "Print a stack trace.", ""),
        ("f(a,\n  b) -> int\n\nCompute f.", "Compute f.", ""),
        ("Only a summary line.", "Only a summary line.", ""),
    ],
)
def test_split_summary(docstring: str, summary: str, text: str) -> None:
    split = split_summary(docstring)
    assert (split.summary, split.text) == (summary, text)


@pytest.mark.slow
def test_real_stdlib_with_a_cap() -> None:
    c = build_embedded(max_documents=200)
    assert len(c.documents) == 200 and c.documents["doc_id"].is_unique
    splits = set(c.queries["split"])
    assert {"train", "test"} <= splits
    assert c.counts["modules_parsed"] > 300 and c.counts["documents_over_cap"] > 1000
    assert not c.documents["doc_id"].str.match(r"(test|idlelib|lib2to3|turtledemo)\.").any()
    assert not c.documents["doc_id"].str.contains(r"(?:^|\.)_").any()
    assert (c.documents["text"].str.split().str.len() >= 8).all()
    assert stdlib_version().split()[1] == ".".join(map(str, sys.version_info[:3]))
