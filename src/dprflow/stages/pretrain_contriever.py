"""Stage ``pretrain_contriever``: Contriever's contrastive pre-training (Contriever §3, Appendix A).

Each step holds ``batch_size`` "documents" of Appendix A: windows of ``max_doc_tokens`` (256)
tokens of the collection's token stream (its documents, passages joined by ``doc_id``,
concatenated; ``--documents stream``), or with ``--documents first`` each document cut to its
first ``max_doc_tokens`` tokens, and makes one positive pair of each: two independent
random crops (``--pairs crop``) or a span and the rest of the document (``--pairs ict``), each
view perturbed by token deletion / replacement / masking (:mod:`dprflow.pretraining.contriever.data`).
The loss is InfoNCE over mean-pooled embeddings with temperature 0.05 (§3.1.1) against the
other keys of the batch (``--negatives inbatch``, SimCLR) or against a queue of keys from a
momentum encoder (``--negatives moco``, the paper's choice; §3.1.3).

Defaults follow Appendix A's model fine-tuned on MS MARCO (momentum 0.999, spans of 10% to 50% of
256-token documents, word deletion 20%, AdamW at 1e-4), except the queue (Appendix A: 65,536;
131,072 for the unsupervised model) and the batch (2,048), which are sized for small corpora.

The output folder's top level is the query encoder, a plain BERT (``AutoModel`` loads it: the
fine-tuning stages start from it); ``contriever/`` holds the key encoder, the queue and the
config, and is part of every checkpoint, so a killed run resumes exactly.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from dprflow.cli import run_stage
from dprflow.data.token_store import Ranges, document_ranges, window_ranges
from dprflow.errors import StageError
from dprflow.files import scratch_dir
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.contriever import longest_view
from dprflow.pretraining.contriever.data import PAIR_MODES, PairMaker
from dprflow.pretraining.contriever.model import NEGATIVE_MODES, Contriever, ContrieverConfig
from dprflow.pretraining.documents import CorpusArgs, open_or_tokenize, store_documents
from dprflow.stage_args import TrainArgs
from dprflow.training import distributed
from dprflow.training.memory import (
    EncoderShape,
    StepMemory,
    check_training_memory,
    contrastive_cache_bytes,
    encoder_shape,
    holds_gradients,
    per_process,
    world_size,
)
from dprflow.training.speed import set_seed
from dprflow.training.trainer import train_and_save

log = logging.getLogger("dprflow.pretrain_contriever")

MIN_DOC_TOKENS = 2  # ICT needs a span and a non-empty rest; cropping needs one token per view


@dataclass(kw_only=True)
class Args(TrainArgs, CorpusArgs):
    """Contriever contrastive pre-training on a collection's documents."""

    init: str = field(metadata={"help": "encoder to start from: folder, packaged name or hub id"})
    passages: str | None = field(
        default=None,
        metadata={"help": "passages.parquet of the collection (documents: grouped by doc_id)"},
    )
    tokens: str | None = field(
        default=None,
        metadata={
            "help": "token store of the corpus (stage pretrain_tokenize): view documents of --passages, "
            "texts of --corpus; default: tokenize now"
        },
    )
    out: str = field(metadata={"help": "model folder to write"})
    checkpoint_dir: str = field(metadata={"help": "resumable checkpoints"})
    negatives: str = field(
        default="moco",
        metadata={
            "help": "moco (momentum encoder + queue) or inbatch (SimCLR), §3.1.3",
            "choices": list(NEGATIVE_MODES),
        },
    )
    pairs: str = field(
        default="crop",
        metadata={
            "help": "crop (independent cropping) or ict (inverse Cloze task), §3.1.2",
            "choices": list(PAIR_MODES),
        },
    )
    queue_size: int = field(
        default=64, metadata={"help": "MoCo queue of negative keys (Appendix A: 65536; unsupervised 131072)"}
    )
    momentum: float = field(default=0.999, metadata={"help": "key encoder EMA momentum (Appendix A: 0.999)"})
    temperature: float = field(default=0.05, metadata={"help": "InfoNCE temperature (Appendix A: 0.05)"})
    symmetric: bool = field(default=False, metadata={"help": "inbatch: average both directions of the loss"})
    ratio_min: float = field(
        default=0.1, metadata={"help": "shortest span, share of the document (Appendix A: 0.1)"}
    )
    ratio_max: float = field(
        default=0.5, metadata={"help": "longest span, share of the document (Appendix A: 0.5)"}
    )
    max_doc_tokens: int = field(default=256, metadata={"help": "tokens per document (Appendix A: 256)"})
    documents: str = field(
        default="stream",
        metadata={
            "help": "stream: windows of max_doc_tokens of the concatenated corpus (Appendix A); "
            "first: each document's first max_doc_tokens tokens",
            "choices": ["stream", "first"],
        },
    )
    p_delete: float = field(default=0.2, metadata={"help": "token deletion probability (Appendix A: 0.2)"})
    p_replace: float = field(default=0.0, metadata={"help": "random-token replacement probability"})
    p_mask: float = field(default=0.0, metadata={"help": "[MASK] replacement probability"})
    ict_keep_prob: float = field(
        default=0.0, metadata={"help": "ict: keep the span in the key (Lee et al.: 0.1)"}
    )
    batch_size: int = field(default=8, metadata={"help": "documents (pairs) per step (Appendix A: 2048)"})
    learning_rate: float = field(
        default=1e-4, metadata={"help": "AdamW peak learning rate (Appendix A: 1e-4)"}
    )

    @property
    def source(self) -> str:
        """What the documents are read from, for messages: the corpus file, or the collection's passages."""
        return self.corpus_path or self.corpus or self.passages

    def check(self) -> None:
        if not 0.0 < self.ratio_min <= self.ratio_max <= 1.0:
            raise ValueError("need 0 < --ratio-min <= --ratio-max <= 1")
        if self.max_doc_tokens < MIN_DOC_TOKENS:
            raise ValueError(f"--max-doc-tokens must be >= {MIN_DOC_TOKENS}")
        if self.p_delete + self.p_replace + self.p_mask > 1.0:
            raise ValueError("need --p-delete + --p-replace + --p-mask <= 1")
        if self.symmetric and self.negatives != "inbatch":
            raise ValueError("--symmetric applies to --negatives inbatch only")
        if self.queue_size < 1:
            raise ValueError("--queue-size must be >= 1")
        if (self.passages is None) == (self.corpus is None):
            raise ValueError(
                "give one of --passages (the collection's documents) and --corpus (a generic corpus)"
            )


# The config keys that change a step's memory, named when it does not fit.
MEMORY_KEYS = [
    "pretrain.contriever.batch_size",
    "pretrain.contriever.max_doc_tokens",
    "pretrain.contriever.queue_size",
]


def step_memory(args: Args, shape: EncoderShape, world: int | None = None) -> StepMemory:
    """What a step of one process holds: with MoCo its query views through the encoder, the key
    encoder (a copy of the weights, no gradient, §3.1.3), the queue of keys and the scores
    against it; in-batch, both views through the encoder and the scores against the keys of
    every process. Views are taken at their longest, ``max_doc_tokens`` and [CLS], [SEP]."""
    world = world_size() if world is None else world
    rows = per_process(args.batch_size, world, args.gradient_accumulation_steps)
    length = args.max_doc_tokens + 2
    if args.negatives == "moco":
        queue = args.queue_size * shape.hidden_size * 4
        return StepMemory(
            ((rows, length),),
            frozen_params=shape.params,
            buffer_bytes=queue + contrastive_cache_bytes(rows, 1 + args.queue_size, shape.hidden_size),
            checkpointing=args.gradient_checkpointing,
            accumulates=holds_gradients(args.gradient_accumulation_steps, rows),
        )
    return StepMemory(
        ((2 * rows, length),),
        buffer_bytes=contrastive_cache_bytes(rows, rows * world, shape.hidden_size),
        checkpointing=args.gradient_checkpointing,
        accumulates=holds_gradients(args.gradient_accumulation_steps, rows),
    )


def training_documents(args: Args, tokenizer, scratch: str) -> tuple[Ranges, dict[str, int]]:
    """Contriever's "documents", cut from the token store per batch: windows of the token stream
    (the ranges of :func:`~dprflow.pretraining.contriever.data.stream_documents`) or each
    document's first tokens (:func:`~dprflow.pretraining.contriever.data.first_tokens`)."""
    if args.corpus:  # the generic corpus's texts, each a document
        store = open_or_tokenize(args.tokens, "texts", tokenizer, scratch, args.corpus_path, args.corpus)
    else:
        store = open_or_tokenize(args.tokens, "documents", tokenizer, scratch, args.passages)
    docs, counts = store_documents(store, 1 if args.documents == "stream" else MIN_DOC_TOKENS, args.source)
    if args.documents == "first":
        starts, stops = document_ranges(store, MIN_DOC_TOKENS)
        return Ranges(store, starts, np.minimum(stops, starts + args.max_doc_tokens)), counts
    starts, stops, dropped = window_ranges(store.n_tokens, args.max_doc_tokens, MIN_DOC_TOKENS)
    stream_counts = {
        "stream_tokens": store.n_tokens,
        "stream_documents": len(starts),
        "short_last_window_skipped": dropped,
    }
    counts.update(stream_counts)
    for key, value in stream_counts.items():
        log.info("%s: %d", key, value)
    return Ranges(store, starts, stops), counts


def pretrain(args: Args) -> None:
    with scratch_dir(args.out) as scratch:
        _pretrain(args, scratch)


def _pretrain(args: Args, scratch: str) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = encoder_shape(args.init)
    check_training_memory(
        shape, step_memory(args, shape), args.mem_mb, MEMORY_KEYS, args.precision, attention=args.attention
    )
    tokenizer = load_tokenizer(args.init)
    docs, counts = training_documents(args, tokenizer, scratch)
    if len(docs) < args.batch_size and args.documents == "stream":
        raise StageError(
            f"{args.source}: its {counts['stream_tokens']} tokens make {len(docs)} documents of "
            f"{args.max_doc_tokens} tokens, fewer than one batch of {args.batch_size} "
            "(pretrain.contriever.batch_size); lower pretrain.contriever.batch_size or "
            "pretrain.contriever.max_doc_tokens, or add documents"
        )
    if len(docs) < args.batch_size:
        raise StageError(
            f"{args.source}: {len(docs)} documents of at least {MIN_DOC_TOKENS} tokens "
            f"({counts['documents_too_short_skipped']} too short skipped) are fewer than one batch of "
            f"{args.batch_size} (pretrain.contriever.batch_size); lower pretrain.contriever.batch_size "
            "or add documents"
        )
    maker = PairMaker.from_tokenizer(
        tokenizer,
        mode=args.pairs,
        ratio_min=args.ratio_min,
        ratio_max=args.ratio_max,
        max_doc_tokens=args.max_doc_tokens,
        p_delete=args.p_delete,
        p_replace=args.p_replace,
        p_mask=args.p_mask,
        ict_keep_prob=args.ict_keep_prob,
    )
    set_seed(args.seed)  # the initial queue is drawn from torch's global generator
    config = ContrieverConfig(
        negatives=args.negatives,
        temperature=args.temperature,
        momentum=args.momentum,
        queue_size=args.queue_size,
        symmetric=args.symmetric,
    )
    model = Contriever.from_pretrained(args.init, config)
    positions = getattr(model.encoder.config, "max_position_embeddings", None)
    longest = longest_view(args.pairs, args.ratio_max, args.max_doc_tokens)
    if positions is not None and longest + 2 > positions:
        raise StageError(
            f"--pairs {args.pairs} with --max-doc-tokens {args.max_doc_tokens} and --ratio-max "
            f"{args.ratio_max} gives views of up to {longest} tokens, plus [CLS] and [SEP] more than "
            f"the {positions} positions of {args.init}; lower --max-doc-tokens or --ratio-max"
        )

    def step(m, batch):
        device = next(m.parameters()).device
        inputs = {k: v.to(device) for k, v in batch.items()}
        # Every process's keys are negatives (and enter the queue): gathered with gradient.
        return m(**inputs, gather=distributed.gather_with_grad, rank=distributed.get_rank()).as_dict()

    train_and_save(model, docs, maker.batch, step, Contriever, tokenizer, args, {"corpus": counts})


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, pretrain, argv, "pretrain_contriever")


if __name__ == "__main__":
    sys.exit(main())
