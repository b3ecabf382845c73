"""The published numbers in ``dprflow/evaluation/paper_numbers.csv``: shape, vocabularies, and spot checks.

The spot-checked values were read off the papers' tables (see the ``table`` column); a failing
spot check means the file drifted from what the paper prints.
"""

from __future__ import annotations

from importlib.resources import files

import pandas as pd
import pytest

COLUMNS = ["paper", "table", "reference", "method", "stage", "metric", "value", "note"]
KEY = ["paper", "table", "reference", "method", "stage", "metric"]

PAPERS = {"condenser", "cocondenser", "cdmae", "contriever", "query-as-context"}
BEIR = {
    "trec-covid",
    "nfcorpus",
    "nq",
    "hotpotqa",
    "fiqa",
    "arguana",
    "webis-touche2020",
    "cqadupstack",
    "quora",
    "dbpedia-entity",
    "scidocs",
    "fever",
    "climate-fever",
    "scifact",
}
# beir/avg14: the papers' printed average over the 14 public BEIR datasets above.
REFERENCES = {
    "msmarco-passage/dev",
    "trec-dl-2019",
    "trec-dl-2020",
    "nq/test",
    "triviaqa/test",
    "beir/avg14",
} | {f"beir/{name}" for name in BEIR}
STAGES = {"r1", "r2", "rerank", "distill", "zeroshot", "final", "bm25"}
QA_METRICS = {"Success@1", "Success@5", "Success@20", "Success@100"}  # NQ/TQA top-k hit accuracy
METRICS = {"RR@10", "R@50", "R@100", "R@1000", "nDCG@10"} | QA_METRICS


@pytest.fixture(scope="module")
def numbers() -> pd.DataFrame:
    path = files("dprflow") / "evaluation" / "paper_numbers.csv"
    return pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"note": str})


def test_columns(numbers):
    assert list(numbers.columns) == COLUMNS


def test_values_are_fractions(numbers):
    assert numbers["value"].notna().all()
    assert numbers["value"].between(0.0, 1.0).all(), numbers[~numbers["value"].between(0.0, 1.0)]


def test_no_duplicate_keys(numbers):
    dups = numbers[numbers.duplicated(KEY, keep=False)]
    assert dups.empty, dups[KEY]


def test_vocabularies(numbers):
    assert set(numbers["paper"]) == PAPERS
    assert set(numbers["reference"]) <= REFERENCES, set(numbers["reference"]) - REFERENCES
    assert set(numbers["stage"]) <= STAGES, set(numbers["stage"]) - STAGES
    assert set(numbers["metric"]) <= METRICS, set(numbers["metric"]) - METRICS
    assert numbers["table"].str.match(r"^(Table \d+|Sec\. [\d.]+ \(text\))$").all()
    assert numbers["method"].str.fullmatch(r"[a-z0-9][a-z0-9-]*").all()


def test_bm25_rows_use_the_bm25_stage(numbers):
    assert ((numbers["method"] == "bm25") == (numbers["stage"] == "bm25")).all()


def test_hit_metrics_only_on_open_qa(numbers):
    qa = numbers["reference"].isin(["nq/test", "triviaqa/test"])
    assert (qa == numbers["metric"].isin(QA_METRICS)).all()


@pytest.mark.parametrize(
    ("paper", "table", "reference", "method", "stage", "metric", "value"),
    [
        ("cocondenser", "Table 1", "msmarco-passage/dev", "cocondenser", "r2", "RR@10", 0.382),
        ("cocondenser", "Table 1", "nq/test", "cocondenser", "r2", "Success@5", 0.758),
        ("cocondenser", "Table 5", "msmarco-passage/dev", "condenser", "r1", "RR@10", 0.338),
        ("condenser", "Table 6", "trec-dl-2019", "condenser", "r2", "nDCG@10", 0.698),
        ("cdmae", "Table 2", "msmarco-passage/dev", "cdmae", "distill", "RR@10", 0.417),
        ("cdmae", "Table 2", "msmarco-passage/dev", "cotmae", "r1", "R@1000", 0.983),
        ("contriever", "Table 1", "beir/scifact", "contriever", "r2", "nDCG@10", 0.681),
        ("contriever", "Table 8", "nq/test", "contriever", "zeroshot", "Success@100", 0.813),
    ],
)
def test_spot_checks(numbers, paper, table, reference, method, stage, metric, value):
    row = numbers[
        (numbers["paper"] == paper)
        & (numbers["table"] == table)
        & (numbers["reference"] == reference)
        & (numbers["method"] == method)
        & (numbers["stage"] == stage)
        & (numbers["metric"] == metric)
    ]
    assert len(row) == 1
    assert row["value"].iloc[0] == pytest.approx(value, abs=1e-9)
