"""Stages ``pretrain_mae_generic`` and ``pretrain_mae_corpus``: bottlenecked masked auto-encoder
pre-training, BMAE, CDMAE or CoT-MAE (CDMAE §3; query-as-context §2.2).

CDMAE pre-trains in two stages (Table 5): on a generic corpus from ``model.init``, then on the
target corpus from the stage-one model (decoder, projection and MLM head restored). Both run this
module; they differ in the corpus (``--corpus pydoc|jsonl`` or ``--corpus passages``) and the
initial checkpoint. The loss is L = L_enc + L_dec (eq. 9; CoT-MAE: L_mlm + L_ctx-mlm), batches
come from :mod:`dprflow.pretraining.mae.data`, and the saved folder's encoder loads with
``AutoModel.from_pretrained`` (the decoder is kept in ``mae_decoder/`` for the next stage).

CoT-MAE (``--variant cotmae``) cuts each document into sentence spans and, per step, feeds each
span of a pair once to the encoder and once to the decoder (``--directions both``, its
reference collator), contexts chosen ``--context mixed`` (near / random / overlap); it has no
bottleneck projection (pass ``--use-projection false``; the workflow does for cotmae).

With ``--queries`` (query-as-context §3.2, method ``qac-cotmae``) the decoder reconstructs one
of the passage's doc2query queries (a different candidate each epoch) instead of a context span;
passage -> encoder and query -> decoder only, as the query-as-context code does.

``cdmae`` needs the corpus's n-gram statistics (stage ``pmi``), which give each token its
importance for the decoder's masking.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from dprflow.cli import run_stage
from dprflow.errors import StageError
from dprflow.files import scratch_dir
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.documents import CorpusArgs, open_or_tokenize
from dprflow.pretraining.mae.data import (
    CONTEXTS,
    DIRECTIONS,
    VARIANTS,
    mae_batch,
    pair_mae_batch,
    store_chunks,
    store_cotmae_documents,
)
from dprflow.pretraining.mae.model import BottleneckedMAE, MAEConfig
from dprflow.pretraining.mae.pmi import read_counts_mapped
from dprflow.pretraining.query_as_context import pairs as query_context
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
from dprflow.training.steps import masked_count, share_chunks_step
from dprflow.training.trainer import train_and_save

log = logging.getLogger("dprflow.pretrain_mae")


@dataclass(kw_only=True)
class Args(TrainArgs, CorpusArgs):
    """Pre-train a bottlenecked masked auto-encoder (BMAE, CDMAE, CoT-MAE)."""

    variant: str = field(metadata={"help": "which MAE", "choices": list(VARIANTS)})
    init: str = field(metadata={"help": "model.init, or the stage-one MAE folder"})
    out: str = field(metadata={"help": "model folder to write"})
    checkpoint_dir: str = field(metadata={"help": "resumable checkpoints"})
    pmi: str | None = field(default=None, metadata={"help": "n-gram statistics (stage pmi); cdmae only"})
    tokens: str | None = field(
        default=None,
        metadata={
            "help": "token store of the corpus (stage pretrain_tokenize; view texts/passages, cotmae "
            "text-sentences/document-sentences); default, and always for cdmae: tokenize now"
        },
    )
    p_enc: float = field(default=0.3, metadata={"help": "encoder mask ratio (CDMAE §4.1: 0.3)"})
    p_dec: float = field(default=0.5, metadata={"help": "decoder mask ratio (CDMAE 0.5, CoT-MAE 0.45)"})
    sigma: float = field(default=1.0, metadata={"help": "importance noise std (CDMAE footnote 3: 1)"})
    n_decoder_layers: int = field(default=2, metadata={"help": "decoder Transformer layers (CDMAE: 2)"})
    use_projection: bool | None = field(
        default=None,
        metadata={
            "help": "h_b = W h_c + b (CDMAE eq. 4); false: h_b = h_c. Default: true for bmae and cdmae, "
            "false for cotmae (CoT-MAE's BertForCotMAE has no projection)"
        },
    )
    max_length: int = field(
        default=128, metadata={"help": "bmae/cdmae tokens per sequence, specials included"}
    )
    span_min: int = field(
        default=2, metadata={"help": "cotmae: shortest random span target in tokens (CoT-MAE: 2)"}
    )
    span_max: int = field(
        default=128, metadata={"help": "cotmae: span target and crop length in tokens (CoT-MAE: 128)"}
    )
    context: str = field(
        default="mixed",
        metadata={"help": "cotmae context span (CoT-MAE's default: mixed)", "choices": list(CONTEXTS)},
    )
    directions: str = field(
        default="both",
        metadata={
            "help": "cotmae: both (each span once encoded, once decoded: CoT-MAE's collator) or one "
            "(anchor -> context only)",
            "choices": list(DIRECTIONS),
        },
    )
    queries: str | None = field(
        default=None,
        metadata={
            "help": "cotmae on passages: generated_queries.parquet, the decoder reconstructs a "
            "generated query of the passage (query-as-context) instead of a context span"
        },
    )
    max_query_tokens: int = field(default=32, metadata={"help": "query-as-context: query length in tokens"})
    batch_size: int = field(
        default=16,
        metadata={"help": "sequences (cotmae: documents, 2 rows each with both directions) per step"},
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW peak learning rate"})
    chunk_size: int = field(
        default=0,
        metadata={
            "help": "rows per sub-batch, each MLM loss weighted by the sub-batch's share of the batch's "
            "masked tokens: the whole batch's gradient with one sub-batch in memory (0: the whole batch)"
        },
    )

    def check(self) -> None:
        self.check_corpus()
        if self.chunk_size < 0:
            raise ValueError(f"--chunk-size must be >= 0, got {self.chunk_size}")
        if self.variant == "cdmae" and not self.pmi:
            raise ValueError("--variant cdmae needs --pmi (the n-gram statistics of stage pmi)")
        if not 1 <= self.span_min <= self.span_max:
            raise ValueError("need 1 <= --span-min <= --span-max")
        if self.max_length < 10:
            raise ValueError("--max-length must be at least 10")
        if self.queries and (self.variant != "cotmae" or self.corpus != "passages"):
            raise ValueError("--queries (query-as-context) needs --variant cotmae and --corpus passages")


def corpus_view(args: Args) -> str:
    """The token store view the variant reads: passages or (cotmae on passages) whole documents,
    their passages joined in order, so that anchor and context come from the same document;
    a generic corpus's texts; cotmae's cut in sentences."""
    if args.corpus == "passages" and not args.corpus_path:
        raise StageError("corpus 'passages' needs --corpus-path")
    sentences = args.variant == "cotmae" and not args.queries
    if args.queries:
        return "passages"
    if args.corpus == "passages":
        return "document-sentences" if sentences else "passages"
    return "text-sentences" if sentences else "texts"


def training_items(args: Args, tokenizer, scratch: str) -> tuple[list, dict[str, int]]:
    view = corpus_view(args)
    if args.queries:
        store = open_or_tokenize(args.tokens, view, tokenizer, scratch, args.corpus_path)
        items, counts = query_context.read_items(
            args.corpus_path,
            args.queries,
            tokenizer,
            args.max_length - 2,
            args.max_query_tokens,
            store,
            scratch,
        )
        if len(items) < args.batch_size:
            raise StageError(
                f"{args.queries}: {len(items)} passages with queries, fewer than one batch of "
                f"{args.batch_size} (pretrain.mae.batch_size); lower pretrain.mae.batch_size"
            )
        return items, counts
    stats = None
    if args.variant == "cdmae":
        # memory-mapped in the scratch folder: MS MARCO's table is hundreds of millions of rows
        stats = read_counts_mapped(args.pmi, scratch)
    store = open_or_tokenize(args.tokens, view, tokenizer, scratch, args.corpus_path, args.corpus, stats)
    if args.variant == "cotmae":
        # Cut once with the stage's seed, as CoT-MAE cuts its corpus once before training.
        rng = np.random.default_rng([args.seed, 2208_07670])
        items, counts = store_cotmae_documents(store, rng, args.span_min, args.span_max, scratch)
    else:
        counts = {"texts": len(store)}
        items, dropped = store_chunks(store, args.max_length - 2)
        counts["short_trailing_chunks_skipped"] = dropped
    counts["training_items"] = len(items)
    for key, value in counts.items():
        log.info("%s %s: %d", args.variant, key, value)
    if len(items) < args.batch_size:
        raise StageError(
            f"{args.corpus} corpus gives {len(items)} training items, fewer than one batch of "
            f"{args.batch_size} (pretrain.mae.batch_size); lower pretrain.mae.batch_size"
            + (" or pretrain.mae.max_length" if args.variant != "cotmae" else "")
            + ", or use a larger corpus"
        )
    return items, counts


# The config keys that change a step's memory, named when it does not fit.
CHUNK_KEY = "pretrain.mae.chunk_size"


def memory_keys(args: Args) -> list[str]:
    length = (
        "pretrain.mae.span_max"
        if args.variant == "cotmae" and not args.queries
        else "pretrain.mae.max_length"
    )
    return ["pretrain.mae.batch_size", length]


def step_memory(args: Args, shape: EncoderShape, world: int | None = None) -> StepMemory:
    """What a step of one process holds: its rows through the encoder and the decoder layers
    (eq. 2, 5; one sub-batch of ``chunk_size`` rows at a time), the logits of both MLM losses
    (eq. 3, 6) over the masked tokens, and the decoder, projection and MLM head's weights.
    CoT-MAE rows are spans of up to ``span_max`` tokens, two per document with ``--directions
    both``; with ``--queries`` the decoder reads a query of up to ``max_query_tokens``."""
    world = world_size() if world is None else world
    if args.queries:
        rows, enc, dec = args.batch_size, args.max_length - 2, args.max_query_tokens
    elif args.variant == "cotmae":
        rows = args.batch_size * (2 if args.directions == "both" else 1)
        enc = dec = args.span_max
    else:
        rows, enc, dec = args.batch_size, args.max_length - 2, args.max_length - 2
    local = per_process(rows, world, args.gradient_accumulation_steps)
    rows = per_process(rows, world, args.gradient_accumulation_steps, args.chunk_size)
    projection = args.variant != "cotmae" if args.use_projection is None else args.use_projection
    masked = masked_per_row(args.p_enc, enc) + masked_per_row(args.p_dec, dec)
    return StepMemory(
        ((rows, enc + 2),),
        extra_layers=((rows, dec + 2, args.n_decoder_layers),),
        masked_tokens=rows * masked,
        extra_params=args.n_decoder_layers * shape.layer_params
        + projection * (shape.hidden_size + 1) * shape.hidden_size
        + shape.mlm_head_params,
        checkpointing=args.gradient_checkpointing,
        accumulates=holds_gradients(args.gradient_accumulation_steps, local, args.chunk_size),
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
        shape, step, args.mem_mb, memory_keys(args), args.precision, CHUNK_KEY, attention=args.attention
    )
    tokenizer = load_tokenizer(args.init)
    items, counts = training_items(args, tokenizer, scratch)
    set_seed(args.seed)  # the decoder's and projection's random initialisation
    config = MAEConfig(
        n_decoder_layers=args.n_decoder_layers,
        p_enc=args.p_enc,
        p_dec=args.p_dec,
        use_projection=args.variant != "cotmae" if args.use_projection is None else args.use_projection,
    )
    model = BottleneckedMAE.from_pretrained(args.init, config)

    def make_batch(rng, batch_items, epoch):
        if args.queries:  # query-as-context: the passage to the encoder, a query to the decoder
            passages, queries = query_context.pairs(batch_items, epoch, args.seed)
            return pair_mae_batch(passages, queries, tokenizer, rng, p_enc=args.p_enc, p_dec=args.p_dec)
        return mae_batch(
            args.variant,
            batch_items,
            tokenizer,
            rng,
            p_enc=args.p_enc,
            p_dec=args.p_dec,
            sigma=args.sigma,
            span_max=args.span_max,
            context=args.context,
            directions=args.directions,
        )

    def units(chunk):  # each MLM loss is a mean over its masked tokens (eq. 3, 6)
        return {"enc_mlm": masked_count(chunk["enc_labels"]), "dec_mlm": masked_count(chunk["dec_labels"])}

    def chunk_loss(m, chunk, shares):
        out = m(**chunk)
        enc, dec = out.enc_mlm * shares["enc_mlm"], out.dec_mlm * shares["dec_mlm"]
        weights = model.config
        return {"loss": weights.enc_weight * enc + weights.dec_weight * dec, "enc_mlm": enc, "dec_mlm": dec}

    def step(m, batch, backward):
        device = next(m.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}
        return share_chunks_step(m, batch, args.chunk_size, units, chunk_loss, backward)

    train_and_save(
        model,
        items,
        make_batch,
        step,
        BottleneckedMAE,
        tokenizer,
        args,
        {"corpus_counts": counts},
        manual_backward=True,
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, pretrain, argv, "pretrain_mae")


if __name__ == "__main__":
    sys.exit(main())
