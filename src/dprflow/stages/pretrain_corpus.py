"""Stage ``pretrain_corpus``: coCondenser's corpus-aware pre-training (coCondenser section 3.2-3.3).

Starts from the stage-one Condenser, head included. Each step holds ``batch_size`` documents of
the target corpus and two random spans of each; the loss is the contrastive loss of eq. 6 over
the 2n late-CLS vectors (a span's positive is its sibling, every other span a negative, itself
excluded) plus the Condenser MLM loss (eq. 7). With ``chunk_size`` below 2n the step runs with a
gradient cache (eq. 8-12): the same gradients as the full batch, the memory of one chunk. With
several processes (``gpu`` > 1) eq. 6 ranges over the global batch: the late-CLS vectors of every
process are gathered (:mod:`dprflow.training.steps`), so each span has all 2n - 2 others as negatives.
``--contrastive-only`` drops the MLM terms (coCondenser Table 4's ablation). With ``--queries``
(query-as-context §3.2, method ``qac-cocondenser``) the pair of a passage is the passage and one
of its doc2query queries (a different candidate each epoch) instead of two spans.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dprflow.cli import run_stage
from dprflow.errors import StageError
from dprflow.files import scratch_dir
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.backbone import read_saved_record
from dprflow.pretraining.condenser.data import SPAN_SAMPLERS, mlm_batch, pair_batch
from dprflow.pretraining.condenser.model import HEAD_CONFIG, HEAD_DIR, Condenser, CondenserConfig
from dprflow.pretraining.documents import open_or_tokenize, store_documents
from dprflow.pretraining.masking import WHOLE_WORD_COUNTS
from dprflow.pretraining.query_as_context import pairs as query_context
from dprflow.stage_args import TrainArgs
from dprflow.training.memory import (
    EncoderShape,
    StepMemory,
    check_training_memory,
    contrastive_cache_bytes,
    encoder_shape,
    holds_gradients,
    masked_per_row,
    per_process,
    world_size,
)
from dprflow.training.speed import set_seed
from dprflow.training.steps import cocondenser_step
from dprflow.training.trainer import train_and_save

log = logging.getLogger("dprflow.pretrain_corpus")


@dataclass(kw_only=True)
class Args(TrainArgs):
    """coCondenser pre-training on the target corpus's documents."""

    init: str = field(metadata={"help": "the stage-one Condenser folder (head included)"})
    passages: str = field(metadata={"help": "passages.parquet of the target collection"})
    tokens: str | None = field(
        default=None,
        metadata={
            "help": "token store of the passages (stage pretrain_tokenize; view documents, or passages with "
            "--queries); default: tokenize now"
        },
    )
    out: str = field(metadata={"help": "model folder to write"})
    checkpoint_dir: str = field(metadata={"help": "resumable checkpoints"})
    spans: str = field(
        default="independent",
        metadata={
            "help": "non_overlapping: two distinct consecutive spans of --span-max tokens (the authors'); "
            "independent: two spans of --span-min..--span-max tokens at independent positions",
            "choices": list(SPAN_SAMPLERS),
        },
    )
    span_min: int = field(default=16, metadata={"help": "shortest span in tokens (independent spans)"})
    span_max: int = field(default=64, metadata={"help": "longest span in tokens"})
    mlm_probability: float = field(default=0.15, metadata={"help": "masked share"})
    whole_word: bool = field(default=False, metadata={"help": "mask whole words"})
    whole_word_count: str = field(
        default="words",
        metadata={
            "help": "with --whole-word: words (p of the words) or tokens (BERT's: whole words up to p of the tokens)",
            "choices": list(WHOLE_WORD_COUNTS),
        },
    )
    contrastive_only: bool = field(default=False, metadata={"help": "drop the MLM losses (Table 4)"})
    temperature: float = field(default=1.0, metadata={"help": "contrastive temperature (eq. 6: 1)"})
    batch_size: int = field(default=8, metadata={"help": "documents per step (2 spans each)"})
    chunk_size: int = field(default=0, metadata={"help": "spans per gradient-cache chunk (0: no cache)"})
    queries: str | None = field(
        default=None,
        metadata={
            "help": "generated_queries.parquet: query-as-context pairs (passage, generated query) "
            "instead of two spans of a document"
        },
    )
    max_query_tokens: int = field(default=32, metadata={"help": "query-as-context: query length in tokens"})
    max_passage_tokens: int = field(
        default=144,
        metadata={"help": "query-as-context: passage length in tokens (query-as-context 4.2: 144)"},
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW peak learning rate"})

    def check(self) -> None:
        if not 1 <= self.span_min <= self.span_max:
            raise ValueError("need 1 <= --span-min <= --span-max")
        if self.spans == "non_overlapping" and self.span_min < 2:
            raise ValueError(
                "--spans non_overlapping needs --span-min >= 2 (the shortest document cut in two)"
            )


def training_items(args: Args, tokenizer, scratch: str) -> tuple[list, dict[str, int]]:
    """The documents (token ids, read per batch from the token store) coCondenser samples span
    pairs from, or with ``--queries`` the query-as-context items: passages of at most
    ``max_passage_tokens`` (query-as-context 4.1-4.2: "no more than 144 consecutive tokens")
    with their generated queries."""
    if args.queries:
        store = open_or_tokenize(args.tokens, "passages", tokenizer, scratch, args.passages)
        return query_context.read_items(
            args.passages,
            args.queries,
            tokenizer,
            args.max_passage_tokens,
            args.max_query_tokens,
            store,
            scratch,
        )
    store = open_or_tokenize(args.tokens, "documents", tokenizer, scratch, args.passages)
    return store_documents(store, args.span_min, args.passages)


# The config keys that change a step's memory, named when it does not fit.
MEMORY_KEYS = ["pretrain.cocondenser.batch_size", "pretrain.cocondenser.span_max"]
CHUNK_KEY = "pretrain.cocondenser.chunk_size"


def head_layers(init: str) -> int:
    """The head layers of the stage-one Condenser ``init`` (its saved config; 2, Condenser 4.1,
    when ``init`` is not a local Condenser folder yet, as in a dry run)."""
    record = Path(init) / HEAD_DIR / HEAD_CONFIG
    if not record.is_file():
        return CondenserConfig().n_head_layers
    return int(read_saved_record(record.parent, HEAD_CONFIG, "Condenser")["condenser"]["n_head_layers"])


def step_memory(args: Args, shape: EncoderShape, world: int | None = None) -> StepMemory:
    """What a step of one process holds: its spans (two per document; with ``--queries`` a passage
    and a query) through backbone and head, or with the gradient cache one chunk of them, the
    logits of both MLM losses, and the late-[CLS] vectors, scores and cached gradients of eq. 6
    (each span against the 2n spans of every process)."""
    world = world_size() if world is None else world
    n_head_layers = head_layers(args.init)
    spans = per_process(2 * args.batch_size, world, args.gradient_accumulation_steps)
    rows = per_process(2 * args.batch_size, world, args.gradient_accumulation_steps, args.chunk_size)
    tokens = max(args.max_passage_tokens, args.max_query_tokens) if args.queries else args.span_max
    return StepMemory(
        ((rows, tokens + 2),),
        extra_layers=((rows, tokens + 2, n_head_layers),),
        masked_tokens=2 * rows * masked_per_row(args.mlm_probability, tokens),
        extra_params=n_head_layers * shape.layer_params + shape.mlm_head_params,
        buffer_bytes=contrastive_cache_bytes(spans, spans * world, shape.hidden_size),
        checkpointing=args.gradient_checkpointing,
        accumulates=holds_gradients(args.gradient_accumulation_steps, spans, args.chunk_size),
    )


def pretrain(args: Args) -> None:
    with scratch_dir(args.out) as scratch:
        _pretrain(args, scratch)


def _pretrain(args: Args, scratch: str) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = encoder_shape(args.init)
    step = step_memory(args, shape)
    check_training_memory(
        shape, step, args.mem_mb, MEMORY_KEYS, args.precision, CHUNK_KEY, attention=args.attention
    )
    tokenizer = load_tokenizer(args.init)
    docs, counts = training_items(args, tokenizer, scratch)
    if len(docs) < args.batch_size:
        raise StageError(
            f"{args.passages}: {len(docs)} {'passages with queries' if args.queries else 'documents'} "
            f"are fewer than one batch of {args.batch_size} (pretrain.cocondenser.batch_size); lower "
            "pretrain.cocondenser.batch_size, or pre-train on a larger corpus (pretrain.cocondenser.corpus)"
        )
    set_seed(args.seed)
    weight = 0.0 if args.contrastive_only else 1.0
    config = CondenserConfig(head_weight=weight, backbone_weight=weight, temperature=args.temperature)
    model = Condenser.from_pretrained(args.init, config)
    if not model.head_restored:  # coCondenser 4.1 warm-starts "both backbone and head"
        log.warning(
            "%s has no Condenser head (a folder of pretrain_generic, or the authors' model.pt): "
            "stage two starts from a random head",
            args.init,
        )

    def make_batch(rng, batch_docs, epoch):
        if args.queries:  # rows 2i and 2i + 1: a passage and its query of this epoch
            passages, queries = query_context.pairs(batch_docs, epoch, args.seed)
            rows = [row for pair in zip(passages, queries, strict=True) for row in pair]
            return mlm_batch(
                rows, tokenizer, rng, args.mlm_probability, args.whole_word, args.whole_word_count
            )
        return pair_batch(
            batch_docs,
            tokenizer,
            rng,
            args.span_min,
            args.span_max,
            args.mlm_probability,
            args.whole_word,
            args.whole_word_count,
            args.spans,
        )

    def step(m, batch, backward):
        device = next(m.parameters()).device
        out = cocondenser_step(m, {k: v.to(device) for k, v in batch.items()}, args.chunk_size, backward)
        return out.as_dict()

    train_and_save(
        model, docs, make_batch, step, Condenser, tokenizer, args, {"documents": counts}, manual_backward=True
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, pretrain, argv, "pretrain_corpus")


if __name__ == "__main__":
    sys.exit(main())
