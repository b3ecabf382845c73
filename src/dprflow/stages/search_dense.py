"""Stage ``search_dense``: exact inner-product search (faiss) of the evaluation and training queries.

With cosine similarity the corpus and query embeddings are unit vectors, so the inner product is
the cosine. ``--encoder-out`` records the geometry the run used (shown in the comparison table).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field

import torch

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.errors import StageError
from dprflow.files import atomic_path
from dprflow.finetuning.biencoder import BiEncoder, load_tokenizer, model_prompts
from dprflow.hardware import stage_device
from dprflow.models.st_format import POOLINGS, SIMILARITIES, with_prompt
from dprflow.precision import PRECISIONS, resolve_precision
from dprflow.search.dense import (
    FlatIndex,
    embeddings_precision,
    encode_texts,
    iter_run_frames,
    iter_search_run,
    search_shards,
)
from dprflow.search.geometry import geometry_field
from dprflow.search.runs import write_run_pieces

log = logging.getLogger("dprflow.search_dense")


@dataclass
class Args:
    """Search the encoded corpus shards with two query splits."""

    model: str = field(metadata={"help": "bi-encoder folder or model.init"})
    embeddings: list[str] = field(metadata={"help": "the corpus shards, all of them"})
    queries: str = field(metadata={"help": "queries.parquet"})
    out: str = field(metadata={"help": "run.parquet of the evaluation split"})
    trec: str = field(metadata={"help": "TREC run file of the evaluation split"})

    train_out: str | None = field(
        default=None,
        metadata={
            "help": "run.parquet of the training split (for mining); left out, only the evaluation split "
            "is searched (a row scored on another collection)"
        },
    )
    eval_split: str = field(default="test", metadata={"help": "evaluation split"})
    train_split: str = field(default="train", metadata={"help": "training split"})
    depth: int = field(default=1000, metadata={"help": "hits per evaluation query"})
    train_depth: int = field(default=200, metadata={"help": "hits per training query"})
    encoder_out: str | None = field(
        default=None, metadata={"help": "JSON file to write the pooling and similarity used into"}
    )
    pooling: str | None = geometry_field("pooling", POOLINGS)
    similarity: str | None = geometry_field("similarity (cosine: unit vectors)", SIMILARITIES)
    max_length: int = field(default=32, metadata={"help": "query tokens"})
    batch_size: int = field(default=128, metadata={"help": "queries per encoding and search batch"})
    tag: str = field(default="dprflow", metadata={"help": "TREC run tag"})
    precision: str = field(
        default="auto",
        metadata={
            "help": "query encoding precision for shards that do not record theirs (auto, bf16, fp16, "
            "fp32); shards that record one (encode_corpus) decide: queries match their passages",
            "choices": list(PRECISIONS),
        },
    )
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: default)"})
    shard_at_a_time: bool = field(
        default=False,
        metadata={
            "help": "hold one embedding shard's index in memory at a time and merge the per-shard "
            "top-k (memory: one shard, not the corpus) instead of one index of every shard"
        },
    )


def query_precision(args: Args, device: torch.device) -> str:
    """The queries are encoded in the precision of their passages (recorded in the shards), so the
    two sides of a row's scores agree; ``--precision`` decides for shards that record none."""
    try:
        recorded = embeddings_precision(args.embeddings)
    except ValueError as exc:
        raise StageError(str(exc)) from exc
    wanted = resolve_precision(args.precision, device)
    if recorded is None:
        log.info("queries encoded in %s (the shards record no precision)", wanted)
        return wanted
    if recorded != wanted:
        log.warning(
            "queries encoded in %s, the precision of the passages (--precision %s gives %s here)",
            recorded,
            args.precision,
            wanted,
        )
    else:
        log.info("queries encoded in %s, as the passages", recorded)
    return recorded


def search(args: Args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    index = None if args.shard_at_a_time else FlatIndex.from_files(args.embeddings)
    tokenizer = load_tokenizer(args.model)
    device = stage_device()
    precision = query_precision(args, device)
    model = (
        BiEncoder.from_pretrained(args.model, pooling=args.pooling, similarity=args.similarity)
        .to(device)
        .eval()
    )
    queries = read_table(args.queries, "queries")
    # a model that ships a query prompt is fed it, as sentence-transformers' encode_query
    prompts = model_prompts(args.model)
    log.info(
        "queries encoded on %s; prompts: query %r, passage %r", device, prompts["query"], prompts["passage"]
    )
    searches = [(args.eval_split, args.depth, args.out, args.trec)]
    if args.train_out:
        searches.append((args.train_split, args.train_depth, args.train_out, None))
    jobs = []
    for split, depth, out, trec in searches:
        chosen = queries[queries["split"] == split]
        if chosen.empty:
            raise StageError(f"{args.queries}: no query of split {split!r}")
        emb = encode_texts(
            with_prompt(chosen["text"].tolist(), prompts["query"]),
            tokenizer,
            model.encode_query,
            args.max_length,
            batch_size=args.batch_size,
            device=device,
            autocast=None if precision == "fp32" else precision,
        )
        jobs.append((split, depth, out, trec, chosen["query_id"].tolist(), emb))
    if args.shard_at_a_time:
        ids, best = search_shards(
            args.embeddings, [job[5] for job in jobs], [job[1] for job in jobs], batch_size=args.batch_size
        )
        runs = [
            iter_run_frames(job[4], *found, ids, batch_size=args.batch_size)
            for job, found in zip(jobs, best, strict=True)
        ]
    else:
        runs = [iter_search_run(index, job[4], job[5], job[1], batch_size=args.batch_size) for job in jobs]
    for (split, depth, out, trec, query_ids, _), pieces in zip(jobs, runs, strict=True):
        # Written query batch by query batch: the run (502k x 200 rows for MS MARCO's training
        # queries) is never whole in memory.
        counts = write_run_pieces(pieces, out, trec, tag=args.tag)
        log.info("split %s: %d queries, depth %d, %d rows", split, len(query_ids), depth, counts["rows"])
    if args.encoder_out:
        record = {
            "model": args.model,
            "pooling": model.pooling,
            "similarity": model.similarity,
            "source": model.source,
            "prompts": prompts,
        }
        with atomic_path(args.encoder_out) as tmp:
            tmp.write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, search, argv, "search_dense")


if __name__ == "__main__":
    sys.exit(main())
