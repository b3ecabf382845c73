"""Stage ``train_reranker``: a cross-encoder trained with a list-wise cross-entropy over
(positive, hard negatives) groups mined by retriever 2 (CDMAE section 3.4, Stage 3; no in-batch
negatives for a cross-encoder)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dprflow.cli import run_stage
from dprflow.files import scratch_dir
from dprflow.finetuning.biencoder import load_tokenizer
from dprflow.finetuning.cross_encoder import CrossEncoder
from dprflow.finetuning.examples import GroupTrainingArgs, read_training_examples, sample_group
from dprflow.finetuning.losses import listwise_ce
from dprflow.finetuning.pretokenized import GroupTokens, from_ids_if_same, pair_batch
from dprflow.finetuning.reranking import tokenize_pairs
from dprflow.finetuning.selection import apply_selections
from dprflow.training.memory import (
    EncoderShape,
    StepMemory,
    check_training_memory,
    holds_gradients,
    per_process,
    world_size,
)
from dprflow.training.speed import set_seed
from dprflow.training.steps import share_chunks_step
from dprflow.training.trainer import train_and_save

log = logging.getLogger("dprflow.train_reranker")


@dataclass(kw_only=True)
class Args(GroupTrainingArgs):
    """Fine-tune a cross-encoder reranker."""

    max_length: int = field(default=176, metadata={"help": "query + passage tokens"})
    pooling: str | None = field(
        default=None,
        metadata={
            "help": "head on the pooler over [CLS] (cls) or on the mean of the tokens (mean); "
            "default: the initial model's own pooling, else cls",
            "choices": ["cls", "mean"],
        },
    )
    method: str | None = field(default=None, metadata={"help": "pre-training method, for the model card"})
    chunk_size: int = field(
        default=0,
        metadata={
            "help": "queries (with their groups) per sub-batch, each weighted by its share of the "
            "batch: the whole batch's gradient with one sub-batch in memory (0: the whole batch)"
        },
    )

    def check(self) -> None:
        if self.chunk_size < 0:
            raise ValueError(f"--chunk-size must be >= 0, got {self.chunk_size}")


def step_memory(args: Args, shape: EncoderShape, world: int | None = None) -> StepMemory:
    """What a step of one process holds: the (query, passage) pairs of its share of the batch,
    one micro-batch and one chunk of queries of it at a time (``shape``, the encoder's, adds
    nothing here: the same call as every training stage's)."""
    world = world_size() if world is None else world
    k = args.gradient_accumulation_steps
    queries = per_process(args.batch_size, world, k, args.chunk_size)
    return StepMemory(
        ((queries * args.group_size, args.max_length),),
        checkpointing=args.gradient_checkpointing,
        accumulates=holds_gradients(k, per_process(args.batch_size, world, k), args.chunk_size),
    )


def train(args: Args) -> None:
    if args.selection:  # settings chosen on held-out training queries (docs/selection.md)
        chosen = apply_selections(args, args.selection, ("reranker",))
        args.check()
        log.info("settings chosen on held-out queries (%s): %s", ", ".join(args.selection), chosen)
    with scratch_dir(args.out) as scratch:  # the passages' texts, read a batch at a time
        fine_tune(args, scratch)


def fine_tune(args: Args, scratch: str) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.init)
    set_seed(args.seed)  # the classification head's random initialisation
    model = CrossEncoder.from_pretrained(args.init, pooling=args.pooling)
    args.pooling = model.pooling  # recorded as trained
    log.info("head on %s pooling", model.pooling)
    items, counts, texts = read_training_examples(args, tokenizer, scratch)
    G = args.group_size
    check_training_memory(
        model,
        step_memory(args, EncoderShape.of(model)),
        args.mem_mb,
        ["finetune.reranker.batch_size", "finetune.reranker.group_size", "finetune.reranker.max_length"],
        args.precision,
        chunk_key="finetune.reranker.chunk_size",
        attention=args.attention,
    )

    def from_texts(rng, batch_items):
        groups = [sample_group(rng, it, G) for it in batch_items]
        return tokenize_pairs(
            tokenizer,
            [it.text for it, g in zip(batch_items, groups, strict=True) for _ in g],
            [texts[pid] for g in groups for pid in g],
            args.max_length,
        )

    train_items, make_batch = items, from_texts
    if args.pretokenize:  # the same batches, from ids made once (finetuning/pretokenized.py)
        # a side of a pair is never longer than the pair's budget
        budget = args.max_length - 3
        tokens = GroupTokens(items, texts, tokenizer, budget, budget, Path(scratch) / "tokens")

        def from_ids(rng, indexed):
            groups = [sample_group(rng, it, G) for _, it in indexed]
            return pair_batch(
                [tokens.queries[i] for (i, _), g in zip(indexed, groups, strict=True) for _ in g],
                [tokens.passages[pid] for g in groups for pid in g],
                tokenizer,
                args.max_length,
            )

        train_items, make_batch = from_ids_if_same("train_reranker", items, from_ids, from_texts)

    def units(chunk):
        return {"loss": len(chunk["input_ids"]) // G}  # queries: the loss is a mean over them

    def chunk_loss(m, chunk, shares):
        scores = m(**chunk).view(-1, G)  # [B, G], the positive in column 0
        return {"loss": listwise_ce(scores) * shares["loss"]}

    def step(m, batch, backward):
        device = next(m.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}
        return share_chunks_step(m, batch, args.chunk_size * G, units, chunk_loss, backward)

    train_and_save(
        model,
        train_items,
        make_batch,
        step,
        CrossEncoder,
        tokenizer,
        args,
        {"training_queries": counts},
        manual_backward=True,
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, train, argv, "train_reranker")


if __name__ == "__main__":
    sys.exit(main())
