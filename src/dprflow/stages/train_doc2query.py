"""Stage ``train_doc2query``: fine-tune the doc2query generator on (query, positive passage) pairs.

Query-as-context §3.1 generates queries with a T5 fine-tuned on MS MARCO (doc2query). Here the
generator is trained on the training split's pairs only: a query with each passage of each of its
relevant documents. Before training, every query text of the evaluation splits (``--eval-splits``)
is checked against the training queries; a match fails the stage (the generated pre-training
queries would leak the test set). A seeded ``--validation-fraction`` of the pairs, whole queries at
a time, is held out; their mean token cross-entropy before and after training is logged and
stored in the model folder (``training_args.json`` and ``dprflow_doc2query.json``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field

import torch

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table
from dprflow.files import publish, staging_path, update_json
from dprflow.pretraining.query_as_context.doc2query import (
    CONFIG_NAME,
    QueryGenerator,
    check_no_eval_leakage,
    generator_inputs,
    normalise_query,
    split_by_query,
    training_pairs,
)
from dprflow.stage_args import TrainArgs
from dprflow.training.speed import set_seed
from dprflow.training.trainer import train_and_save

log = logging.getLogger("dprflow.train_doc2query")


@dataclass(kw_only=True)
class Args(TrainArgs):
    """Fine-tune a doc2query generator (T5 / BART checkpoint, or BERT2BERT from an encoder)."""

    init: str = field(
        metadata={"help": "seq2seq checkpoint, or an encoder to warm-start BERT2BERT (model.init)"}
    )
    queries: str = field(metadata={"help": "queries.parquet"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    out: str = field(metadata={"help": "model folder to write"})
    checkpoint_dir: str = field(metadata={"help": "resumable checkpoints"})
    split: str = field(default="train", metadata={"help": "the split whose pairs train the generator"})
    eval_splits: list[str] = field(
        default_factory=lambda: ["dev", "test"],
        metadata={"help": "splits whose query texts must not be training queries (leakage check)"},
    )
    drop_eval_overlap: bool = field(
        default=False,
        metadata={
            "help": "train without the training queries whose text is an evaluation query's (logged), "
            "instead of failing the leakage check"
        },
    )
    max_passage_length: int = field(default=256, metadata={"help": "passage tokens (longer: cut)"})
    max_query_length: int = field(default=32, metadata={"help": "query tokens with EOS (longer: cut)"})
    input_prefix: str = field(default="", metadata={"help": "text put before each passage (T5 prefix)"})
    validation_fraction: float = field(
        default=0.1, metadata={"help": "share of the pairs held out (whole queries) for the validation loss"}
    )
    batch_size: int = field(default=16, metadata={"help": "pairs per optimizer step"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW peak learning rate"})

    def check(self) -> None:
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"--validation-fraction must be in [0, 1), got {self.validation_fraction}")
        if self.split in self.eval_splits:
            raise ValueError(f"--split {self.split!r} is also in --eval-splits {self.eval_splits}")
        if self.max_passage_length < 2 or self.max_query_length < 2:
            raise ValueError("--max-passage-length and --max-query-length must be at least 2")


def train(args: Args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    set_seed(args.seed)  # the warm start's new cross-attention weights are drawn here
    generator = QueryGenerator.from_pretrained(
        args.init,
        max_passage_length=args.max_passage_length,
        max_query_length=args.max_query_length,
        input_prefix=args.input_prefix,
    )
    tokenizer = generator.tokenizer
    queries = read_table(args.queries, "queries")
    passages = read_table(args.passages, "passages")
    pairs, counts = training_pairs(queries, args.split, read_table(args.qrels, "qrels"), passages)
    for key, n in counts.items():
        log.info("training pairs, %s: %d", key, n)

    present = sorted(set(queries["split"]) & set(args.eval_splits))
    absent = sorted(set(args.eval_splits) - set(present))
    if absent:
        log.info("eval splits with no query in %s (nothing to check): %s", args.queries, absent)
    evaluation = queries[queries["split"].isin(present)]
    evaluation_texts = dict(zip(evaluation["query_id"], evaluation["text"], strict=True))
    if args.drop_eval_overlap:
        evaluation_normalised = {normalise_query(text) for text in evaluation_texts.values()}
        kept = [p for p in pairs if normalise_query(p.query) not in evaluation_normalised]
        dropped = sorted({p.query_id for p in pairs} - {p.query_id for p in kept})
        pairs = kept
        log.info(
            "drop_eval_overlap: %d training queries whose text is an evaluation query's left out of the "
            "generator's training (%d pairs left): %s",
            len(dropped),
            len(pairs),
            ", ".join(dropped[:20]),
        )
    check_no_eval_leakage(
        {p.query_id: p.query for p in pairs},
        evaluation_texts,
    )
    log.info("leakage check: none of %d %s query texts is a training query", len(evaluation), present)

    train_pairs, held_out = split_by_query(pairs, args.validation_fraction, args.seed)
    log.info(
        "%d training pairs (%d queries), %d held-out pairs (%d queries)",
        len(train_pairs),
        len({p.query_id for p in train_pairs}),
        len(held_out),
        len({p.query_id for p in held_out}),
    )
    texts = generator_inputs(passages, tokenizer)

    def validation_loss() -> float | None:
        if not held_out:
            return None
        return generator.mean_loss([texts[p.passage_id] for p in held_out], [p.query for p in held_out])

    before = validation_loss()

    def make_batch(rng, batch_pairs):
        return generator.tokenize_pairs(
            [texts[p.passage_id] for p in batch_pairs], [p.query for p in batch_pairs]
        )

    def step(m, batch):
        device = next(m.parameters()).device
        return {"loss": m(**{k: v.to(device) for k, v in batch.items()})}

    # Train into a staging folder; it becomes ``out`` only once the validation loss is stored.
    staging = staging_path(args.out)
    record = {
        "training_pairs": counts,
        "train_pairs": len(train_pairs),
        "validation_pairs": len(held_out),
        "validation_queries": len({p.query_id for p in held_out}),
    }
    train_and_save(
        generator,
        train_pairs,
        make_batch,
        step,
        QueryGenerator,
        tokenizer,
        dataclasses.replace(args, out=str(staging)),
        record,
    )
    if int(os.environ.get("RANK", "0")) != 0:
        return
    after = validation_loss()
    if after is None:
        log.info("validation loss: no held-out pairs (--validation-fraction 0)")
    else:
        log.info(
            "validation loss (mean token cross-entropy over %d held-out pairs): %.4f before training, %.4f after",
            len(held_out),
            before,
            after,
        )
    result = {"out": args.out, "validation_loss": after, "validation_loss_init": before}
    update_json(staging / "training_args.json", result)
    update_json(staging / CONFIG_NAME, result, section="extra")
    publish(staging, args.out)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, train, argv, "train_doc2query")


if __name__ == "__main__":
    sys.exit(main())
