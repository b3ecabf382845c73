"""Stage ``score_candidates``: the reranker labels each training query's positives and top
candidates from retriever 2, the soft labels of the distilled retriever."""

from __future__ import annotations

import hashlib
import logging
import sys
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from dprflow.cli import run_stage
from dprflow.data.ids import id_set, in_set
from dprflow.data.schemas import iter_table, read_table, write_table
from dprflow.finetuning.reranking import score_with_reranker
from dprflow.finetuning.selection import chosen_path
from dprflow.precision import PRECISIONS
from dprflow.search.runs import read_positive_passages, run_passages

log = logging.getLogger("dprflow.score_candidates")


@dataclass
class Args:
    """Teacher scores for distillation."""

    model: list[str] = field(
        metadata={"help": "reranker folder: one, or each reranker grid point's (--selection says whose)"}
    )
    negatives: str = field(metadata={"help": "negatives.parquet (retriever 2, top K3)"})
    queries: str = field(metadata={"help": "queries.parquet"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    out: str = field(metadata={"help": "scores.parquet to write"})
    split: str = field(default="train", metadata={"help": "training split"})
    candidates: int = field(default=16, metadata={"help": "negatives scored per query (the top ones)"})
    max_queries: int = field(
        default=0, metadata={"help": "label a stable subset of this many queries (0: all)"}
    )
    max_length: int = field(default=176, metadata={"help": "query + passage tokens"})
    batch_size: int = field(default=64, metadata={"help": "pairs per batch"})
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto (bf16 where the GPU supports it, else fp16; fp32 on CPU), bf16, fp16, fp32",
            "choices": list(PRECISIONS),
        },
    )
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: default)"})
    selection: str | None = field(
        default=None,
        metadata={
            "help": "select_settings' selection.json of the reranker's grid: whose of --model is chosen"
        },
    )


def score(args: Args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    queries = read_table(args.queries, "queries")
    queries = queries[queries["split"] == args.split].set_index("query_id")["text"]
    if args.max_queries and len(queries) > args.max_queries:
        # A stable subset: the queries with the smallest hash of their id.
        keys = queries.index.map(lambda q: hashlib.sha1(q.encode()).hexdigest())
        queries = queries.iloc[np.argsort(np.asarray(keys))[: args.max_queries]]
        log.info("labelling a stable subset of %d training queries", len(queries))
    # The pool is read piece by piece, keeping the candidates of the labelled queries, and of the
    # passages only those of the pairs: memory follows the pairs, not the pool or the corpus.
    labelled = id_set(queries.index)
    negatives = pd.concat(
        [
            piece[(piece["rank"] <= args.candidates).to_numpy() & in_set(piece["query_id"], labelled)]
            for piece in iter_table(args.negatives, "negatives", batch_rows=1 << 20)
        ]
        or [read_table(args.negatives, "negatives")],
        ignore_index=True,
    )
    positives = read_positive_passages(args.qrels, args.passages)
    positives = positives[positives["query_id"].isin(set(negatives["query_id"]))]
    pairs = pd.concat([positives, negatives[["query_id", "passage_id"]]]).drop_duplicates(ignore_index=True)
    passages = run_passages(args.passages, pairs["passage_id"], ["passage_id", "doc_id", "title", "text"])
    model = chosen_path(args.model, args.selection, "reranker")
    log.info("teacher %s", model)
    pairs["score"] = score_with_reranker(
        model, queries, passages, pairs, args.max_length, args.batch_size, args.precision
    )
    write_table(pairs, args.out, "scores")
    log.info(
        "scored %d pairs (%d positives) of %d queries",
        len(pairs),
        len(positives),
        pairs["query_id"].nunique(),
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, score, argv, "score_candidates")


if __name__ == "__main__":
    sys.exit(main())
