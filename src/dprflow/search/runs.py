"""Runs and negative pools: TREC output, positives per query, and negatives from a run.

The TREC files are the formats trec_eval, ir_measures, ranx and pyserini read: a run line is
``query_id Q0 id rank score tag`` and a qrels line ``query_id 0 doc_id relevance``. Scores are
written with nine significant digits, which gives back every float32 score exactly, so a tool
reading the file ranks (and breaks ties) as the Parquet run does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from dprflow.data.schemas import atomic_path, write_table

log = logging.getLogger(__name__)


def write_run(
    run: pd.DataFrame, parquet_path: str | Path, trec_path: str | Path | None = None, tag: str = "dprflow"
) -> None:
    """Write a run as Parquet (the ``run`` schema) and optionally as a TREC run file."""
    write_table(run, parquet_path, "run")
    if trec_path is not None:
        write_trec_run(run, trec_path, "passage_id", tag)


def write_trec_run(run: pd.DataFrame, path: str | Path, id_column: str, tag: str) -> None:
    """A TREC run file of ``run`` (``query_id``, ``id_column``, ``score``, ``rank``)."""
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        for qid, pid, score, rank in run[["query_id", id_column, "score", "rank"]].itertuples(index=False):
            fh.write(f"{qid} Q0 {pid} {rank} {float(score):.9g} {tag}\n")


def write_trec_qrels(qrels: pd.DataFrame, path: str | Path) -> None:
    """A TREC qrels file of ``qrels`` (``query_id``, ``doc_id``, ``relevance``)."""
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        for qid, did, rel in qrels[["query_id", "doc_id", "relevance"]].itertuples(index=False):
            fh.write(f"{qid} 0 {did} {int(rel)}\n")


def positive_passages(qrels: pd.DataFrame, passages: pd.DataFrame) -> pd.DataFrame:
    """(query_id, passage_id) of every passage of every relevant (relevance > 0) document."""
    rel = qrels.loc[qrels["relevance"] > 0, ["query_id", "doc_id"]]
    return rel.merge(passages[["passage_id", "doc_id"]], on="doc_id")[["query_id", "passage_id"]]


def negatives_from_run(run: pd.DataFrame, positives: pd.DataFrame, depth: int) -> pd.DataFrame:
    """The top ``depth`` passages of each query minus its positives, re-ranked from 1 (``negatives`` schema)."""
    top = run[run["rank"] <= depth]
    flagged = top.merge(positives.assign(_pos=True), on=["query_id", "passage_id"], how="left")
    negatives = flagged[flagged["_pos"].isna()].drop(columns="_pos")
    removed = len(top) - len(negatives)
    negatives = negatives.sort_values(["query_id", "rank"], kind="stable").copy()
    negatives["rank"] = negatives.groupby("query_id").cumcount() + 1
    log.info(
        "negatives: %d candidates in the top %d, %d positives removed, %d kept for %d queries",
        len(top),
        depth,
        removed,
        len(negatives),
        negatives["query_id"].nunique(),
    )
    return negatives[["query_id", "passage_id", "score", "rank"]].reset_index(drop=True)
