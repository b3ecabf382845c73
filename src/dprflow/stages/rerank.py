"""Stage ``rerank``: the cross-encoder reorders the top K3 of retriever 2's evaluation run."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import torch

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.finetuning.reranking import rerank_run, score_with_reranker
from dprflow.precision import PRECISIONS
from dprflow.search.runs import write_run

log = logging.getLogger("dprflow.rerank")


@dataclass
class Args:
    """Rerank a run with a cross-encoder."""

    model: str = field(metadata={"help": "reranker folder"})
    run: str = field(metadata={"help": "run.parquet to rerank"})
    queries: str = field(metadata={"help": "queries.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    out: str = field(metadata={"help": "reranked run.parquet"})
    trec: str = field(metadata={"help": "reranked TREC run"})
    depth: int = field(default=100, metadata={"help": "K3: rerank this many per query"})
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


def rerank(args: Args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    run = read_table(args.run, "run")
    queries = read_table(args.queries, "queries").set_index("query_id")["text"]
    top = run[run["rank"] <= args.depth]
    passages = read_table(args.passages, "passages")
    scores = score_with_reranker(
        args.model, queries, passages, top, args.max_length, args.batch_size, args.precision
    )
    write_run(rerank_run(run, scores, args.depth), args.out, args.trec, tag="rerank")
    log.info("reranked %d pairs of %d queries", len(top), top["query_id"].nunique())


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, rerank, argv, "rerank")


if __name__ == "__main__":
    sys.exit(main())
