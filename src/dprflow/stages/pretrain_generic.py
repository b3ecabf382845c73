"""Stage ``pretrain_generic``: Condenser pre-training on a generic corpus (Condenser section 3.3-3.4).

The backbone starts from ``model.init``; the head (2 fresh Transformer layers over the late CLS
and the early token states, eq. 8) and the two MLM losses (eq. 9-11) are trained together. The
output folder loads with ``AutoModel.from_pretrained`` as a plain BERT (the encoder a retriever
starts from) and keeps the head in ``condenser_head/`` for coCondenser's second stage.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import torch

from dprflow.cli import run_stage
from dprflow.data.token_store import Ranges, chunk_ranges
from dprflow.errors import StageError
from dprflow.files import scratch_dir
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.condenser.data import mlm_batch
from dprflow.pretraining.condenser.model import Condenser, CondenserConfig
from dprflow.pretraining.documents import CorpusArgs, open_or_tokenize
from dprflow.stage_args import TrainArgs
from dprflow.training.memory import (
    EncoderShape,
    StepMemory,
    check_training_memory,
    encoder_shape,
    holds_gradients,
    masked_per_row,
    per_process,
    world_size,
)
from dprflow.training.speed import set_seed
from dprflow.training.trainer import train_and_save

log = logging.getLogger("dprflow.pretrain_generic")


@dataclass(kw_only=True)
class Args(TrainArgs, CorpusArgs):
    """Pre-train a Condenser with MLM on a generic corpus."""

    init: str = field(metadata={"help": "the backbone's initial checkpoint (model.init)"})
    out: str = field(metadata={"help": "model folder to write"})
    checkpoint_dir: str = field(metadata={"help": "resumable checkpoints"})
    tokens: str | None = field(
        default=None,
        metadata={
            "help": "token store of the corpus, view texts (stage pretrain_tokenize); default: tokenize now"
        },
    )
    max_length: int = field(default=128, metadata={"help": "tokens per sequence, [CLS] and [SEP] included"})
    mlm_probability: float = field(default=0.15, metadata={"help": "masked share (BERT: 0.15)"})
    whole_word: bool = field(default=False, metadata={"help": "mask whole words"})
    whole_word_count: str = field(
        default="words",
        metadata={
            "help": "with --whole-word: words (p of the words) or tokens (BERT's reference: whole "
            "words up to p of the tokens)",
            "choices": ["words", "tokens"],
        },
    )
    n_early: int = field(default=0, metadata={"help": "early backbone layers (0: half)"})
    n_head_layers: int = field(default=2, metadata={"help": "Condenser head layers"})
    batch_size: int = field(default=16, metadata={"help": "sequences per step"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW peak learning rate"})

    def check(self) -> None:
        self.check_corpus()


# The config keys that change a step's memory, named when it does not fit.
MEMORY_KEYS = ["pretrain.condenser.batch_size", "pretrain.condenser.max_length"]


def step_memory(args: Args, shape: EncoderShape, world: int | None = None) -> StepMemory:
    """What a step of one process holds: its sequences through the backbone and the head layers
    (eq. 6-8), and the logits of both MLM losses (eq. 9-10) over the masked tokens."""
    rows = per_process(
        args.batch_size, world_size() if world is None else world, args.gradient_accumulation_steps
    )
    length = args.max_length
    return StepMemory(
        ((rows, length),),
        extra_layers=((rows, length, args.n_head_layers),),
        masked_tokens=2 * rows * masked_per_row(args.mlm_probability, length - 2),
        extra_params=args.n_head_layers * shape.layer_params + shape.mlm_head_params,
        checkpointing=args.gradient_checkpointing,
        accumulates=holds_gradients(args.gradient_accumulation_steps, rows),
    )


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
    store = open_or_tokenize(args.tokens, "texts", tokenizer, scratch, args.corpus_path, args.corpus)
    # MLM chunks of max_length - 2 tokens, cut from the store per batch (corpus.chunk_tokens' ranges)
    starts, stops, _ = chunk_ranges(store, args.max_length - 2, min_length=8)
    chunks = Ranges(store, starts, stops)
    if len(chunks) < args.batch_size:
        raise StageError(
            f"the {args.corpus} corpus gives {len(chunks)} sequences of at most {args.max_length} tokens, "
            f"fewer than one batch of {args.batch_size} (pretrain.condenser.batch_size); lower "
            "pretrain.condenser.batch_size or pretrain.condenser.max_length, or use a larger corpus "
            "(pretrain.generic_corpus)"
        )
    log.info(
        "generic corpus %s: %d sequences of at most %d tokens", args.corpus, len(chunks), args.max_length
    )
    set_seed(args.seed)  # the head's random initialisation
    config = CondenserConfig(
        n_early=args.n_early or None, n_head_layers=args.n_head_layers, mlm_probability=args.mlm_probability
    )
    model = Condenser.from_pretrained(args.init, config)

    def make_batch(rng, pieces):
        return mlm_batch(pieces, tokenizer, rng, args.mlm_probability, args.whole_word, args.whole_word_count)

    def step(m, batch):
        device = next(m.parameters()).device
        out = m(**{k: v.to(device) for k, v in batch.items()})
        return {"loss": out.loss, "head_mlm": out.head_mlm, "backbone_mlm": out.backbone_mlm}

    train_and_save(model, chunks, make_batch, step, Condenser, tokenizer, args, {"sequences": len(chunks)})


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, pretrain, argv, "pretrain_generic")


if __name__ == "__main__":
    sys.exit(main())
