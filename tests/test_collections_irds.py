"""Tests of the ir_datasets loader, offline: tiny local datasets registered in ir_datasets' registry.

The datasets are real ir_datasets objects (``Dataset`` over ``TsvDocs``/``TsvQueries``/``TrecQrels``
reading ``LocalDownload`` files in tmp_path), so the loader runs its real path; the network is
blocked for every test here, and ``IR_DATASETS_HOME`` points into tmp_path.
"""

from __future__ import annotations

import socket
import uuid
from typing import NamedTuple

import pandas as pd
import pytest

ir_datasets = pytest.importorskip("ir_datasets")
from ir_datasets.datasets.base import Dataset  # noqa: E402
from ir_datasets.formats import TrecQrels, TsvDocs, TsvQueries  # noqa: E402
from ir_datasets.util import LocalDownload  # noqa: E402

from dprflow.data.collections.beir import CollectionError  # noqa: E402
from dprflow.data.collections.irds import doc_fields, infer_split, load_ir_datasets, query_text_field  # noqa: E402


class TitleDoc(NamedTuple):  # like dpr-w100 and BEIR documents
    doc_id: str
    text: str
    title: str


class BodyDoc(NamedTuple):  # like msmarco-document
    doc_id: str
    url: str
    title: str
    body: str


class AbstractDoc(NamedTuple):  # no text field that the loader knows
    doc_id: str
    abstract: str


class Topic(NamedTuple):  # like TREC topics: no `text` field
    query_id: str
    title: str
    description: str


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Fail any attempt to open a network connection; keep ir_datasets' home inside tmp_path."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "ir_datasets_home"))


@pytest.fixture
def register():
    """Register datasets under a unique id prefix; remove them afterwards."""
    names: list[str] = []
    prefix = f"dprflow-test-{uuid.uuid4().hex[:8]}"

    def add(suffix: str, *components) -> str:
        name = prefix + suffix
        ir_datasets.registry.register(name, Dataset(*components))
        names.append(name)
        return name

    yield add
    for name in names:
        ir_datasets.registry._registered.pop(name, None)


def write(tmp_path, name: str, text: str) -> LocalDownload:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return LocalDownload(path)


@pytest.fixture
def toy(tmp_path, register):
    """A collection with train and test splits, in the shape of beir/scifact."""
    docs = TsvDocs(
        write(
            tmp_path, "docs.tsv", "d1\talpha text\tAlpha\nd2\tbeta text\t\nd3\t\t\nd4\tdelta text\tDelta\n"
        ),
        doc_cls=TitleDoc,
    )
    train_q = TsvQueries(
        write(tmp_path, "train_q.tsv", "q1\tfirst query\nq2\tsecond query\nq5\tnever judged\n")
    )
    test_q = TsvQueries(write(tmp_path, "test_q.tsv", "q3\t\nq4\tfourth query\n"))
    train_r = TrecQrels(
        write(tmp_path, "train.qrels", "q1 0 d1 2\nq1 0 d2 0\nq2 0 d4 1\nq2 0 gone 1\nq1 0 d1 2\n"), {}
    )
    test_r = TrecQrels(write(tmp_path, "test.qrels", "q3 0 d3 1\nq4 0 d1 -1\nq9 0 d1 1\n"), {})
    root = register("", docs)
    train = register("/train", docs, train_q, train_r)
    test = register("/test", docs, test_q, test_r)
    return root, train, test


def test_loads_exact_tables(toy):
    root, train, test = toy
    c = load_ir_datasets(root, {"train": train, "test": test})
    assert c.documents.to_dict("records") == [
        {"doc_id": "d1", "title": "Alpha", "text": "alpha text"},
        {"doc_id": "d2", "title": "", "text": "beta text"},
        {"doc_id": "d3", "title": "", "text": ""},
        {"doc_id": "d4", "title": "Delta", "text": "delta text"},
    ]
    assert c.queries.to_dict("records") == [
        {"query_id": "q1", "text": "first query", "split": "train"},
        {"query_id": "q2", "text": "second query", "split": "train"},
        {"query_id": "q5", "text": "never judged", "split": "unjudged"},
        {"query_id": "q3", "text": "", "split": "test"},
        {"query_id": "q4", "text": "fourth query", "split": "test"},
    ]
    assert c.qrels.to_dict("records") == [
        {"query_id": "q1", "doc_id": "d1", "relevance": 2},
        {"query_id": "q1", "doc_id": "d2", "relevance": 0},
        {"query_id": "q2", "doc_id": "d4", "relevance": 1},
        {"query_id": "q3", "doc_id": "d3", "relevance": 1},
        {"query_id": "q4", "doc_id": "d1", "relevance": -1},
    ]
    assert str(c.qrels["relevance"].dtype) == "int32"
    assert c.counts == {
        "documents": 4,
        "documents_empty": 1,
        "queries": 5,
        "queries_empty": 1,
        "queries_unjudged": 1,
        "queries_train": 2,
        "queries_test": 2,
        "queries_without_relevant": 1,  # q4: judged -1 only
        "qrels": 5,
        "qrels_nonpositive": 2,
        "qrels_duplicate": 1,
        "qrels_unknown_doc": 1,
        "qrels_unknown_query": 1,
    }


@pytest.mark.parametrize("batch", [1, 3])
def test_streamed_documents_equal_the_whole_table(toy, batch):
    from dprflow.data.collections import Documents

    root, train, test = toy
    whole = load_ir_datasets(root, {"train": train, "test": test})
    batches = []
    streamed = load_ir_datasets(root, {"train": train, "test": test}, Documents(batches.append, batch))
    assert streamed.documents is None
    assert [len(b) for b in batches] == [batch] * (4 // batch) + [4 % batch] * (4 % batch > 0)
    pd.testing.assert_frame_equal(pd.concat(batches, ignore_index=True), whole.documents)
    pd.testing.assert_frame_equal(streamed.queries, whole.queries)
    pd.testing.assert_frame_equal(streamed.qrels, whole.qrels)
    assert streamed.counts == whole.counts


def test_split_inferred_from_the_id(toy):
    _, train, _ = toy
    c = load_ir_datasets(train)
    assert c.queries["split"].tolist() == ["train", "train", "unjudged"]
    assert infer_split("msmarco-passage/dev/small") == "dev"
    assert infer_split("dpr-w100/natural-questions/train") == "train"
    assert infer_split("beir/trec-covid") == "test"


def test_body_documents_and_topic_queries(tmp_path, register):
    docs = TsvDocs(write(tmp_path, "docs.tsv", "D1\thttp://a\tThe title\tThe body\n"), doc_cls=BodyDoc)
    queries = TsvQueries(write(tmp_path, "q.tsv", "7\ttopic title\tlong description\n"), query_cls=Topic)
    qrels = TrecQrels(write(tmp_path, "r.qrels", "7 0 D1 3\n"), {})
    name = register("/dev", docs, queries, qrels)
    c = load_ir_datasets(name)
    assert c.documents.to_dict("records") == [{"doc_id": "D1", "title": "The title", "text": "The body"}]
    assert c.queries.to_dict("records") == [{"query_id": "7", "text": "topic title", "split": "dev"}]
    assert c.qrels.to_dict("records") == [{"query_id": "7", "doc_id": "D1", "relevance": 3}]


def test_field_mapping_of_real_ir_datasets_types():
    # Only the types are looked at: nothing is downloaded (the network is blocked).
    assert doc_fields(ir_datasets.load("msmarco-passage").docs_cls()) == (None, "text")
    assert doc_fields(ir_datasets.load("msmarco-document").docs_cls()) == ("title", "body")
    nq = ir_datasets.load("dpr-w100/natural-questions/train")
    assert doc_fields(nq.docs_cls()) == ("title", "text")
    assert query_text_field(nq.queries_cls()) == "text"
    assert query_text_field(Topic) == "title"


def test_document_type_without_text_lists_its_fields(tmp_path, register):
    name = register("", TsvDocs(write(tmp_path, "docs.tsv", "d1\tx\n"), doc_cls=AbstractDoc))
    with pytest.raises(
        CollectionError,
        match=r"AbstractDoc has no 'text' or 'body' field \(fields: \['doc_id', 'abstract'\]\)",
    ):
        load_ir_datasets(name, {"test": name})


def test_unknown_id_is_named():
    with pytest.raises(
        CollectionError, match=r"unknown ir_datasets id 'msmarco-pasage'.*close: msmarco-passage"
    ):
        load_ir_datasets("msmarco-pasage", {"dev": "msmarco-passage/dev/small"})


def test_unknown_split_name_lists_the_allowed(toy):
    root, train, _ = toy
    with pytest.raises(
        CollectionError, match=r"unknown split name\(s\) \['validation'\].*allowed: train, dev, test"
    ):
        load_ir_datasets(root, {"validation": train})


def test_split_without_queries_or_qrels(toy):
    root, _, _ = toy
    with pytest.raises(CollectionError, match=r"has no queries and qrels"):
        load_ir_datasets(root)


def test_query_judged_in_two_splits(toy):
    root, train, _ = toy
    with pytest.raises(
        CollectionError, match=r"qrel 1: query 'q1' is judged in split 'test' but also in 'train'"
    ):
        load_ir_datasets(root, {"train": train, "test": train})


def test_split_from_another_collection(tmp_path, register, toy):
    root, _, _ = toy
    queries = TsvQueries(write(tmp_path, "other_q.tsv", "q1\tfirst query\n"))
    qrels = TrecQrels(write(tmp_path, "other.qrels", "q1 0 x1 1\nq1 0 x2 1\n"), {})
    other = register("-other/dev", queries, qrels)
    with pytest.raises(CollectionError, match=r"none of its 2 qrels names a known document"):
        load_ir_datasets(root, {"dev": other})


def test_conflicting_text_for_one_query_id(tmp_path, register, toy):
    root, train, _ = toy
    queries = TsvQueries(write(tmp_path, "clash_q.tsv", "q1\tanother text\n"))
    qrels = TrecQrels(write(tmp_path, "clash.qrels", "q1 0 d1 1\n"), {})
    clash = register("-clash/test", queries, qrels)
    with pytest.raises(CollectionError, match=r"query 1: query_id 'q1' has a different text"):
        load_ir_datasets(root, {"train": train, "test": clash})
