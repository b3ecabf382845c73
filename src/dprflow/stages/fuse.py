"""Stage ``fuse``: a dense row fused with BM25 (the row ``<row>+bm25``).

The convex combination of the two runs' normalised scores (min-max, or theoretical min-max with the
dense score's bound from the ``encoder.json`` beside its run) at the normalisation and weight
chosen on the held-out training queries (``fusion.json``, stage ``select_fusion``), or
reciprocal rank fusion
(:func:`dprflow.search.fusion.fuse_runs`, through pyserini's fusion functions).
Streamed by whole queries: a piece of the dense run and the same queries' BM25 rows in memory.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd

from dprflow.cli import run_stage
from dprflow.data.schemas import iter_query_groups
from dprflow.errors import StageError
from dprflow.search.fusion import FUSION_METHODS, dense_lower_bound, fuse_runs, read_encoder
from dprflow.search.runs import write_run_pieces

log = logging.getLogger("dprflow.fuse")


@dataclass
class Args:
    """Fuse a dense run with BM25's run of the same queries."""

    dense: str = field(metadata={"help": "the dense row's run.parquet"})
    bm25: str = field(metadata={"help": "BM25's run.parquet of the same queries"})
    out: str = field(metadata={"help": "run.parquet to write"})
    trec: str = field(metadata={"help": "TREC run file to write"})
    method: str = field(default="convex", metadata={"help": "convex or rrf", "choices": list(FUSION_METHODS)})
    fusion: str | None = field(
        default=None, metadata={"help": "select_fusion's fusion.json: the convex weight"}
    )
    rrf_k: int = field(default=60, metadata={"help": "RRF's k"})
    depth: int = field(default=1000, metadata={"help": "passages kept per query"})
    tag: str = field(default="dprflow-fused", metadata={"help": "TREC run tag"})

    def check(self) -> None:
        if self.method == "convex" and not self.fusion:
            raise ValueError("--method convex needs --fusion (the weight chosen on held-out queries)")


def chosen_fusion(path: str, method: str) -> tuple[str, float]:
    """The normalisation and the dense weight select_fusion chose."""
    with open(path) as fh:
        fusion = json.load(fh)
    if fusion.get("method") != method or "weight" not in fusion or "normalization" not in fusion:
        raise StageError(f"{path}: no fusion weight chosen for method {method!r}")
    return fusion["normalization"], float(fusion["weight"])


def paired_pieces(dense: str, bm25: str) -> Iterator[tuple[pd.DataFrame, pd.DataFrame]]:
    """Each piece of whole queries of the dense run, with the BM25 rows of its queries. BM25's run
    is read ahead only as far as those queries need (both runs list queries in the split's order,
    so little is held); a dense query BM25 did not answer fuses with nothing."""
    held: dict[str, pd.DataFrame] = {}
    ahead = iter_query_groups(bm25, "run")
    exhausted = False
    for piece in iter_query_groups(dense, "run"):
        wanted = set(piece["query_id"])
        while not exhausted and not wanted <= held.keys():
            try:
                more = next(ahead)
            except StopIteration:
                exhausted = True
                break
            held.update(dict(tuple(more.groupby("query_id", sort=False))))
        parts = [held.pop(q) for q in piece["query_id"].unique() if q in held]
        yield piece, pd.concat(parts, ignore_index=True) if parts else piece.iloc[:0]


def fuse(args: Args) -> dict[str, int]:
    normalization, weight = chosen_fusion(args.fusion, args.method) if args.method == "convex" else ("", 0.0)
    lower = dense_lower_bound(read_encoder(args.dense)) if normalization == "theoretical" else None

    def pieces():
        for dense, bm25 in paired_pieces(args.dense, args.bm25):
            yield fuse_runs(dense, bm25, args.method, weight, args.rrf_k, args.depth, normalization, lower)

    counts = write_run_pieces(pieces(), args.out, args.trec, args.tag)
    log.info(
        "%s: %s fusion (%s, dense weight %s) of %s and %s: %s",
        args.out,
        args.method,
        normalization or "ranks",
        weight,
        args.dense,
        args.bm25,
        counts,
    )
    if counts["rows"] == 0:
        raise StageError(f"{args.dense}: an empty run")
    return {"normalization": normalization, "weight": weight, **counts}


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, fuse, argv, "fuse")


if __name__ == "__main__":
    sys.exit(main())
