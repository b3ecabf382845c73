"""dprflow.plan.collections and dprflow.plan.doc2query: each collection's settings, where a row is
scored, the ingest jobs' and the doc2query jobs' inputs and flags, without Snakemake."""

from __future__ import annotations

import shlex
from types import SimpleNamespace as W

from config_edits import SCHEMA, edited_config

from dprflow.plan.collections import CollectionPlan
from dprflow.plan.doc2query import Doc2QueryPlan

COLLECTIONS = {
    "docs": {
        "source": "embedded",
        "max_documents": None,
        "split_percent": {"train": 60, "dev": 10, "test": 30},
        "eval_split": "test",
        "train_split": "train",
        "reference": "",
        "evaluate_only": False,
    },
    "beir one": {
        "source": "beir",
        "path": "",
        "eval_split": "test",
        "train_split": "test",
        "reference": "scifact",
        "evaluate_only": False,
    },
}


def plan(tmp_path=None) -> CollectionPlan:
    collections = {name: dict(spec) for name, spec in COLLECTIONS.items()}
    if tmp_path is not None:
        collections["beir one"]["path"] = str(tmp_path / "my beir")
    corpora = {"wiki": {"source": "embedded", "eval_split": "test", "train_split": "train"}}
    config = {"collections": collections, "pretrain": {"corpora": corpora}}
    return CollectionPlan(config, "results", ["docs", "beir one"])


def test_a_collection_or_a_pretraining_corpus_has_its_settings_and_splits():
    p = plan()
    assert p.spec(W(collection="wiki"))["source"] == "embedded"
    assert p.eval_split(W(collection="docs")) == "test" and p.train_split(W(collection="docs")) == "train"
    assert p.trained_on_collections() == ["beir one"]  # scored on the split it trains on
    assert p.paper_references() == ["beir one=scifact"]
    assert p.scored_splits() == ["docs=test", "beir one=test"]
    assert p.trec_qrels_files() == [
        "results/docs/collection/qrels.test.trec",
        "results/beir one/collection/qrels.test.trec",
    ]


def test_a_row_is_scored_on_its_transfer_target_or_where_it_lives():
    p = plan()
    assert p.scored_collection(W(collection="docs", system="none/seed-13/r2/on-cisi")) == "cisi"
    assert p.scored_collection(W(collection="docs", retriever="seed-13/r1")) == "docs"
    assert p.scored_collection(W(collection="docs", target="wiki", system="bm25")) == "wiki"
    queries = p.of_scored_collection("results/{collection}/collection/queries.parquet")
    assert (
        queries(W(collection="docs", retriever="zeroshot/on-cisi"))
        == "results/cisi/collection/queries.parquet"
    )
    assert p.scored_eval_split(W(collection="beir one", system="bm25")) == "test"


def test_ingest_reads_the_beir_files_that_exist_and_quotes_every_value(tmp_path):
    p = plan(tmp_path)
    (tmp_path / "my beir" / "qrels").mkdir(parents=True)
    (tmp_path / "my beir" / "qrels" / "test.tsv").write_text("q\tc\t1\n")
    beir = W(collection="beir one")
    root = str(tmp_path / "my beir")
    assert p.ingest_inputs(beir) == [
        f"{root}/corpus.jsonl",
        f"{root}/queries.jsonl",
        f"{root}/qrels/test.tsv",
    ]
    assert shlex.split(p.ingest_flags(beir)) == ["--source", "beir", "--path", root]
    assert p.ingest_inputs(W(collection="docs")) == []
    assert shlex.split(p.ingest_flags(W(collection="docs"))) == [
        "--source",
        "embedded",
        "--split-percent",
        "60",
        "10",
        "30",
    ]
    assert p.ingest_out_dir(beir) == "results/beir one/collection"


def doc2query(edit=None) -> Doc2QueryPlan:
    config = edited_config(edit)
    return Doc2QueryPlan(config, SCHEMA, "results", CollectionPlan(config, "results", ["stdlib"]))


def test_the_generator_is_trained_on_the_collection_unless_one_is_named_and_never_sees_eval_queries():
    d = doc2query()
    docs = W(collection="stdlib")
    assert d.model(docs) == "results/stdlib/doc2query/model" and d.model_input(docs) == [d.model(docs)]
    assert d.eval_splits(docs) == ["dev", "test"]
    flags = shlex.split(d.train_flags(docs))
    assert flags[flags.index("--eval-splits") + 1 : flags.index("--eval-splits") + 3] == ["dev", "test"]
    named = doc2query(
        lambda c: c["pretrain"]["doc2query"].update(
            model="castorini/doc2query-t5-base-msmarco", input_prefix="a b: "
        )
    )
    assert named.model(docs) == "castorini/doc2query-t5-base-msmarco" and named.model_input(docs) == []
    generate = shlex.split(named.generate_flags(docs))
    assert generate[generate.index("--input-prefix") + 1] == "a b: "
