"""A dense run fused with BM25's run of the same queries (rows ``<row>+bm25``, docs/selection.md).

``convex``: the convex combination of the two runs' normalised scores (Bruch et al. 2023, ACM
TOIS, eq. 3: ``w * dense + (1 - w) * bm25``), normalised per query by one of (their section 4.1):

* ``minmax`` (their MM): ``(s - min_q) / (max_q - min_q)`` over the query's retrieved list;
* ``theoretical`` (their TMM, the normalisation of their TM2C2): ``(s - m) / (max_q - m)``, with
  ``m`` the score's theoretical minimum: 0 for BM25, -1 for cosine similarity. A dot-product
  row has no minimum: its scores are min-max normalised. The lowest retrieved score of a query
  says more about the list's depth than about relevance; the bound does not move with it.

``rrf``: reciprocal rank fusion (Cormack et al. 2009, ``1 / (k + rank)``, k = 60).

The normalised runs are combined by pyserini's fusion functions (``interpolation``,
``reciprocal_rank_fusion``; its ``normalize`` is MM). Neither pyserini nor ranx implements TMM:
its few lines are here. A passage missing from one run takes 0 there, the normalised minimum.
The weight ``w`` and the normalisation are chosen on held-out training queries (stage
``select_fusion``); stage ``fuse`` writes the fused row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dprflow.errors import StageError

FUSION_METHODS = ("convex", "rrf")
NORMALIZATIONS = ("theoretical", "minmax")
# The theoretical minimum of a dense row's score by its similarity (encoder.json's); BM25's is 0
# (Lucene's BM25: a non-negative idf times a non-negative term weight). Dot products have none.
DENSE_LOWER_BOUNDS = {"cosine": -1.0}
BM25_LOWER_BOUND = 0.0


def read_encoder(run_path: str | Path) -> dict:
    """The encoder.json search_dense writes beside a dense run (its pooling and similarity)."""
    path = Path(run_path).with_name("encoder.json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: the dense run's encoder record is missing or unreadable ({exc})") from exc


def dense_lower_bound(encoder: dict) -> float | None:
    """The theoretical minimum of a dense run's scores, from the encoder.json written beside it
    (its ``similarity``); None where there is none (dot product)."""
    return DENSE_LOWER_BOUNDS.get(encoder.get("similarity"))


def _trec_run(run: pd.DataFrame):
    """A run (query_id, passage_id, score, rank) as pyserini's TrecRun."""
    from pyserini.trectools import TrecRun

    trec = TrecRun()
    trec.run_data = pd.DataFrame(
        {
            "topic": run["query_id"].astype(str).to_numpy(),
            "q0": "Q0",
            "docid": run["passage_id"].astype(str).to_numpy(),
            "rank": run["rank"].to_numpy(),
            "score": run["score"].astype("float64").to_numpy(),
            "tag": "dprflow",
        }
    )
    return trec


def _theoretical_minmax(run, lower: float):
    """TMM in place on a pyserini TrecRun: ``(s - lower) / (max_q - lower)`` per query (0 where
    every score sits at the bound)."""
    data = run.run_data
    high = data.groupby("topic")["score"].transform("max").to_numpy()
    span = high - lower
    scores = data["score"].to_numpy() - lower
    data["score"] = scores / span.clip(min=1e-12) * (span > 0)
    return run


def normalise(run, method: str, lower: float | None):
    """A TrecRun normalised per query: TMM with ``lower`` where ``method`` is ``theoretical`` and
    the score has a bound, else pyserini's min-max."""
    from pyserini.trectools import RescoreMethod

    if method not in NORMALIZATIONS:
        raise ValueError(f"unknown normalisation {method!r}; allowed: {', '.join(NORMALIZATIONS)}")
    if method == "theoretical" and lower is not None:
        return _theoretical_minmax(run, lower)
    return run.rescore(method=RescoreMethod.NORMALIZE)


def normalised_runs(dense: pd.DataFrame, bm25: pd.DataFrame, normalization: str, dense_lower: float | None):
    """The two runs as pyserini TrecRuns, each normalised per query (``normalization``:
    ``minmax``, or ``theoretical`` with the dense score's minimum ``dense_lower`` and BM25's 0).
    :func:`combine` does not change them: a choice among weights normalises once."""
    return (
        normalise(_trec_run(dense), normalization, dense_lower),
        normalise(_trec_run(bm25), normalization, BM25_LOWER_BOUND),
    )


def combine(runs, weight: float, depth: int) -> pd.DataFrame:
    """``weight * dense + (1 - weight) * bm25`` of two normalised TrecRuns (pyserini's
    ``interpolation``, which scales copies), a passage missing from one run taking that run's 0,
    as a run of the ``run`` schema (the top ``depth`` of each query)."""
    from pyserini.fusion import interpolation

    return _run_table(interpolation(list(runs), alpha=weight, k=depth))


def _run_table(fused) -> pd.DataFrame:
    data = fused.run_data
    return pd.DataFrame(
        {
            "query_id": data["topic"].astype(str).to_numpy(),
            "passage_id": data["docid"].astype(str).to_numpy(),
            "score": data["score"].astype("float32").to_numpy(),
            "rank": data["rank"].astype("int32").to_numpy(),
        }
    )


def fuse_runs(
    dense: pd.DataFrame,
    bm25: pd.DataFrame,
    method: str,
    weight: float,
    rrf_k: int,
    depth: int,
    normalization: str = "minmax",
    dense_lower: float | None = None,
) -> pd.DataFrame:
    """The fused run of the same queries' ``dense`` and ``bm25`` runs (the ``run`` schema, the top
    ``depth`` of each query): ``convex``, ``weight * norm(dense) + (1 - weight) * norm(bm25)`` per
    query (:func:`normalised_runs`, :func:`combine`); ``rrf``, the sum of ``1 / (rrf_k + rank)``
    (``normalization`` unused). Ties are broken by passage id (pyserini's merge)."""
    from pyserini.fusion import reciprocal_rank_fusion

    if method not in FUSION_METHODS:
        raise ValueError(f"unknown fusion method {method!r}; allowed: {', '.join(FUSION_METHODS)}")
    if method == "rrf":
        return _run_table(reciprocal_rank_fusion([_trec_run(dense), _trec_run(bm25)], rrf_k=rrf_k, k=depth))
    return combine(normalised_runs(dense, bm25, normalization, dense_lower), weight, depth)
