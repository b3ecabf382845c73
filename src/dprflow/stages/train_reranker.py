"""Stage ``train_reranker``: a cross-encoder trained with a list-wise cross-entropy over
(positive, hard negatives) groups mined by retriever 2 (CDMAE section 3.4, Stage 3; no in-batch
negatives for a cross-encoder)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import torch

from dprflow.cli import run_stage
from dprflow.finetuning.biencoder import load_tokenizer
from dprflow.finetuning.cross_encoder import CrossEncoder
from dprflow.finetuning.examples import GroupTrainingArgs, read_training_examples, sample_group
from dprflow.finetuning.losses import listwise_ce
from dprflow.finetuning.reranking import tokenize_pairs
from dprflow.training.devices import set_seed
from dprflow.training.memory import check_training_memory
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


def train(args: Args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.init)
    set_seed(args.seed)  # the classification head's random initialisation
    model = CrossEncoder.from_pretrained(args.init, pooling=args.pooling)
    args.pooling = model.pooling  # recorded as trained
    log.info("head on %s pooling", model.pooling)
    items, counts, texts = read_training_examples(args, tokenizer)
    G = args.group_size
    check_training_memory(
        model,
        [(args.batch_size * G, args.max_length)],
        args.mem_mb,
        ["finetune.reranker.batch_size", "finetune.reranker.group_size", "finetune.reranker.max_length"],
        args.precision,
    )

    def make_batch(rng, batch_items):
        groups = [sample_group(rng, it, G) for it in batch_items]
        return tokenize_pairs(
            tokenizer,
            [it.text for it, g in zip(batch_items, groups, strict=True) for _ in g],
            [texts[pid] for g in groups for pid in g],
            args.max_length,
        )

    def step(m, batch):
        device = next(m.parameters()).device
        scores = m(**batch.to(device)).view(-1, G)  # [B, G], the positive in column 0
        return {"loss": listwise_ce(scores)}

    train_and_save(
        model, items, make_batch, step, CrossEncoder, tokenizer, args, {"training_queries": counts}
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, train, argv, "train_reranker")


if __name__ == "__main__":
    sys.exit(main())
