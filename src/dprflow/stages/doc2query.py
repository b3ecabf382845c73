"""Stage ``doc2query``: C candidate queries per passage (query-as-context §3.1, §4).

Nucleus sampling with top-p 0.95 among the 25 most likely tokens (the paper's settings), keyed
by passage id: the queries of a passage depend on the model, the seed and the passage only (not
on batching, sorting or ``--max-passages``), so a rerun gives the same table. With
``--max-passages N`` a seeded random sample of N passages (kept in table order) is used.
Writes a ``generated_queries`` table: one row per (passage, query_index).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table, write_table
from dprflow.errors import StageError
from dprflow.hardware import stage_device
from dprflow.precision import PRECISIONS, autocast, resolve_precision
from dprflow.pretraining.query_as_context.doc2query import QueryGenerator, generator_inputs

log = logging.getLogger("dprflow.doc2query")


@dataclass
class Args:
    """Sample candidate queries for passages with a doc2query generator."""

    model: str = field(metadata={"help": "generator folder (train_doc2query) or a seq2seq checkpoint"})
    passages: str = field(metadata={"help": "passages.parquet"})
    out: str = field(metadata={"help": "generated_queries.parquet to write"})
    n_queries: int = field(default=5, metadata={"help": "candidate queries per passage (C)"})
    top_p: float = field(default=0.95, metadata={"help": "nucleus sampling mass (paper: 0.95)"})
    top_k: int = field(default=25, metadata={"help": "sample among this many tokens (paper: 25; 0: all)"})
    max_new_tokens: int = field(default=32, metadata={"help": "longest query in tokens"})
    batch_size: int = field(default=32, metadata={"help": "passages per generation batch"})
    sort_by_length: bool = field(default=True, metadata={"help": "batch passages of similar length"})
    seed: int = field(default=13, metadata={"help": "sampling seed"})
    max_passages: int = field(
        default=0, metadata={"help": "generate for a random sample of N passages (0: all)"}
    )
    max_passage_length: int = field(default=0, metadata={"help": "passage tokens (0: the model's setting)"})
    input_prefix: str | None = field(
        default=None, metadata={"help": "text put before each passage (default: the model's setting)"}
    )
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto (bf16 where the GPU supports it, else fp16; fp32 on CPU), bf16, fp16, fp32",
            "choices": list(PRECISIONS),
        },
    )
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)"})

    def check(self) -> None:
        if self.n_queries < 1 or self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError("--n-queries, --batch-size and --max-new-tokens must be at least 1")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_passages < 0 or self.max_passage_length < 0:
            raise ValueError("--top-k, --max-passages and --max-passage-length must not be negative")


def select_passages(passages: pd.DataFrame, max_passages: int, seed: int) -> pd.DataFrame:
    """All passages, or a seeded random sample of ``max_passages`` of them in table order."""
    if not max_passages or max_passages >= len(passages):
        return passages
    chosen = np.sort(np.random.default_rng([seed, 42_019]).choice(len(passages), max_passages, replace=False))
    return passages.iloc[chosen]


def generate(args: Args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    passages = read_table(args.passages, "passages")
    if passages.empty:
        raise StageError(f"{args.passages}: no passages")
    chosen = select_passages(passages, args.max_passages, args.seed)
    log.info(
        "generating %d queries for each of %d of %d passages%s",
        args.n_queries,
        len(chosen),
        len(passages),
        f" (a random sample, --max-passages {args.max_passages})" if len(chosen) < len(passages) else "",
    )
    generator = QueryGenerator.from_pretrained(
        args.model, max_passage_length=args.max_passage_length or None, input_prefix=args.input_prefix
    )
    device = stage_device()
    generator.to(device)
    precision = resolve_precision(args.precision, device)
    log.info("generating in %s on %s", precision, device)
    texts = generator_inputs(chosen, generator.tokenizer)
    ids = chosen["passage_id"].tolist()
    t0 = time.perf_counter()
    with autocast(precision, device):
        queries = generator.generate(
            [texts[pid] for pid in ids],
            n=args.n_queries,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            sort_by_length=args.sort_by_length,
            seed=args.seed,
            keys=ids,
            log_every=20,
        )
    seconds = time.perf_counter() - t0
    stats = generator.last_stats
    log.info(
        "%d queries in %.1f s (%.2f queries/s); re-sampled empty candidates %d times, %d forced non-empty",
        stats["queries"],
        seconds,
        stats["queries"] / max(seconds, 1e-9),
        stats["resampled"],
        stats["forced"],
    )
    table = pd.DataFrame(
        {
            "passage_id": np.repeat(ids, args.n_queries),
            "query_index": np.tile(np.arange(args.n_queries, dtype=np.int32), len(ids)),
            "text": [q for qs in queries for q in qs],
        }
    )
    distinct = table.groupby("passage_id")["text"].nunique().mean()
    log.info("distinct queries per passage: %.2f of %d on average", distinct, args.n_queries)
    write_table(table, args.out, "generated_queries")


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, generate, argv, "doc2query")


if __name__ == "__main__":
    sys.exit(main())
