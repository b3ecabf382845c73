"""Shared fixtures: a tiny collection written as the ingest stage would, and a tiny BERT."""

from __future__ import annotations

import pandas as pd
import pytest

from dprflow.schemas import write_table


@pytest.fixture
def tiny_collection(tmp_path):
    """Four documents, three queries (two train, one test); returns the folder with the tables."""
    docs = pd.DataFrame(
        {
            "doc_id": ["d1", "d2", "d3", "d4"],
            "title": ["Wings", "Flow", "", "Empty"],
            "text": [
                "Wings lift aircraft. Lift depends on speed.",
                "Boundary layers form on plates.",
                "Heat transfer in hypersonic flow is large.",
                "",
            ],
        }
    )
    queries = pd.DataFrame(
        {
            "query_id": ["q1", "q2", "q3"],
            "text": ["what lifts aircraft", "boundary layer plates", "hypersonic heat"],
            "split": ["train", "train", "test"],
        }
    )
    qrels = pd.DataFrame(
        {"query_id": ["q1", "q2", "q3"], "doc_id": ["d1", "d2", "d3"], "relevance": [1, 2, 1]}
    )
    write_table(docs, tmp_path / "documents.parquet", "documents")
    write_table(queries, tmp_path / "queries.parquet", "queries")
    write_table(qrels, tmp_path / "qrels.parquet", "qrels")
    return tmp_path
