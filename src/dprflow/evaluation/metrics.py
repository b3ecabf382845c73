"""Scoring runs with ir_measures, per query.

Retrieval ranks passages but qrels judge documents, so a passage run is first turned into a
document run by MaxP: a document's score is its best passage's score (Dai and Callan, 2019; with
one passage per document, as in MS MARCO passage, this changes nothing). Queries of the evaluated
split that have at least one relevant judgment (relevance > 0) are scored; a query the run does
not answer counts as 0 on every metric, so a system cannot gain by skipping hard queries.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import ir_measures
import pandas as pd

log = logging.getLogger(__name__)


def passage_run_to_doc_run(run: pd.DataFrame, passages: pd.DataFrame) -> pd.DataFrame:
    """MaxP aggregation: (query_id, passage_id, score) -> (query_id, doc_id, score)."""
    parent = passages.set_index("passage_id")["doc_id"]
    doc_ids = run["passage_id"].map(parent)
    if doc_ids.isna().any():
        missing = run.loc[doc_ids.isna(), "passage_id"].iloc[0]
        raise ValueError(f"run names passage {missing!r}, which is not in the passages table")
    return max_p(run, doc_ids)


def max_p(run: pd.DataFrame, doc_ids: pd.Series) -> pd.DataFrame:
    """MaxP of ``run`` given the document of each of its rows (``doc_ids``, aligned with it)."""
    out = pd.DataFrame({"query_id": run["query_id"], "doc_id": doc_ids, "score": run["score"].astype(float)})
    return out.groupby(["query_id", "doc_id"], as_index=False, sort=False)["score"].max()


def rank_doc_run(doc_run: pd.DataFrame) -> pd.DataFrame:
    """``doc_run`` with a ``rank`` per query (1 = best), in rank order: by score, ties by
    ``doc_id`` descending, the order trec_eval and ir_measures (pytrec_eval) rank in."""
    ranked = doc_run.sort_values(
        ["query_id", "score", "doc_id"], ascending=[True, False, False], kind="stable"
    )
    ranked = ranked.reset_index(drop=True)
    ranked["rank"] = ranked.groupby("query_id", sort=False).cumcount() + 1
    return ranked


def judged_qrels(qrels: pd.DataFrame, query_ids: list[str]) -> pd.DataFrame:
    """The judgments of the queries among ``query_ids`` that have a relevant document
    (relevance > 0): the queries :func:`evaluate_run` scores."""
    qrels = qrels[qrels["query_id"].isin(set(query_ids))]
    judged = set(qrels.loc[qrels["relevance"] > 0, "query_id"])
    return qrels[qrels["query_id"].isin(judged)]


def parse_metrics(names: list[str]) -> list:
    measures = []
    for name in names:
        try:
            measures.append(ir_measures.parse_measure(name))
        except (ValueError, NameError, SyntaxError) as exc:
            raise ValueError(
                f"unknown metric {name!r} (ir_measures names, e.g. RR@10, nDCG@10, R@1000)"
            ) from exc
    return measures


def nested(table: pd.DataFrame, value: str) -> dict[str, dict[str, object]]:
    """``{query_id: {doc_id: value}}`` of a run or qrels table, the form ir_measures converts a
    DataFrame to (a later row of the same pair wins there too), built from whole columns: its
    conversion iterated Arrow-backed columns row by row, 60% of an evaluation's time."""
    out: dict[str, dict[str, object]] = {}
    for qid, did, v in zip(
        table["query_id"].tolist(), table["doc_id"].tolist(), table[value].tolist(), strict=True
    ):
        out.setdefault(qid, {})[did] = v
    return out


def evaluate_run(
    doc_run: pd.DataFrame, qrels: pd.DataFrame, query_ids: list[str], metrics: list[str]
) -> pd.DataFrame:
    """Per-query metric values (query_id, metric, value) over the judged queries among ``query_ids``."""
    return evaluate_pieces([doc_run], qrels, query_ids, metrics)


def evaluate_pieces(
    doc_runs: Iterable[pd.DataFrame], qrels: pd.DataFrame, query_ids: list[str], metrics: list[str]
) -> pd.DataFrame:
    """:func:`evaluate_run` of a document run given in pieces of whole queries (each query's rows
    in one piece), one piece in memory at a time: a query's values depend on its rows alone, so
    the table is the whole run's, row for row (queries sorted, metrics in the order given)."""
    measures = parse_metrics(metrics)
    qrels = judged_qrels(qrels, query_ids)
    judged = sorted(set(qrels["query_id"]))
    wanted = set(judged)
    values = {(qid, str(m)): 0.0 for qid in judged for m in measures}
    answered: set[str] = set()
    for doc_run in doc_runs:
        run = doc_run[doc_run["query_id"].isin(wanted)]
        if run.empty:
            continue
        these = set(run["query_id"])
        judgments = nested(qrels[qrels["query_id"].isin(these)], "relevance")
        for metric in ir_measures.iter_calc(measures, judgments, nested(run, "score")):
            values[(metric.query_id, str(metric.measure))] = float(metric.value)
        answered |= these
    unanswered = len(wanted - answered)
    if unanswered:
        log.info("%d of %d judged queries have no results in the run: scored 0", unanswered, len(judged))
    rows = [(qid, m, v) for (qid, m), v in values.items()]
    return pd.DataFrame(rows, columns=["query_id", "metric", "value"])
