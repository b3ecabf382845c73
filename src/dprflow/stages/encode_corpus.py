"""Stage ``encode_corpus``: one shard of the passages encoded into an embeddings file.

The number of shards only splits the work: every passage is encoded in the same batch whatever
the shard count (the passages are put in one global order, longest first by their ``n_tokens``,
and cut into global batches of ``--batch-size``; a shard encodes the whole batches that hold its
rows), so the shards together hold the same floats, in the same order, for 1 shard or 8, and a
dense search over them gives the same file. Changing ``finetune.encode_shards`` therefore reruns
the encoding and search jobs but no training: the training stages downstream find their inputs
unchanged and reuse their finished models (``dprflow.training.trainer``)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from dprflow.cli import run_stage
from dprflow.data.schemas import read_rows, read_table
from dprflow.errors import StageError
from dprflow.finetuning.biencoder import BiEncoder, load_tokenizer, model_prompts
from dprflow.hardware import stage_device
from dprflow.models.st_format import POOLINGS, SIMILARITIES, with_prompt
from dprflow.models.texts import encoder_texts
from dprflow.precision import PRECISIONS, resolve_precision
from dprflow.search.dense import encode_texts, write_embeddings
from dprflow.search.geometry import geometry_field

log = logging.getLogger("dprflow.encode_corpus")


@dataclass
class Args:
    """Encode shard i of n of the passages."""

    model: str = field(metadata={"help": "bi-encoder folder or model.init"})
    passages: str = field(metadata={"help": "passages.parquet"})
    out: str = field(metadata={"help": "embeddings shard (Parquet) to write"})
    shard: int = field(default=0, metadata={"help": "this shard's index, from 0"})
    num_shards: int = field(default=1, metadata={"help": "number of shards"})
    pooling: str | None = geometry_field("pooling", POOLINGS)
    similarity: str | None = geometry_field("similarity (cosine: unit vectors)", SIMILARITIES)
    max_length: int = field(default=144, metadata={"help": "passage tokens"})
    batch_size: int = field(default=64, metadata={"help": "passages per batch"})
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto (bf16 where the GPU supports it, else fp16; fp32 on CPU), bf16, fp16, fp32; "
            "recorded in the shard, and search encodes the queries the same way",
            "choices": list(PRECISIONS),
        },
    )
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: default)"})

    def check(self) -> None:
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(f"--shard {self.shard} is outside 0..{self.num_shards - 1}")


def shard_rows(n: int, shard: int, num_shards: int) -> slice:
    bounds = np.linspace(0, n, num_shards + 1).astype(int)
    return slice(int(bounds[shard]), int(bounds[shard + 1]))


def global_order(n_tokens: np.ndarray) -> np.ndarray:
    """The order every shard count encodes in: longest passage first (stable, so equal lengths keep
    their row order), which also keeps the padding of each batch small."""
    return np.argsort(-np.asarray(n_tokens, dtype=np.int64), kind="stable")


def batch_aligned(rows: slice, batch_size: int, n: int) -> slice:
    """The smallest run of whole global batches (of ``batch_size``, from row 0) covering ``rows``."""
    return slice(rows.start // batch_size * batch_size, min(-(-rows.stop // batch_size) * batch_size, n))


def encode(args: Args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    # The order needs the token counts only; then only this shard's global batches (their text)
    # are read from the table: memory follows the shard, not the corpus.
    n_tokens = read_table(args.passages, "passages", ["n_tokens"])["n_tokens"].to_numpy()
    order = global_order(n_tokens)
    rows = shard_rows(len(n_tokens), args.shard, args.num_shards)
    aligned = batch_aligned(rows, args.batch_size, len(n_tokens))
    if rows.stop <= rows.start:
        raise StageError(
            f"{args.passages}: shard {args.shard} of {args.num_shards} is empty ({len(n_tokens)} passages)"
        )
    tokenizer = load_tokenizer(args.model)
    device = stage_device()
    precision = resolve_precision(args.precision, device)
    model = (
        BiEncoder.from_pretrained(args.model, pooling=args.pooling, similarity=args.similarity)
        .to(device)
        .eval()
    )
    # The whole global batches around this shard's rows, encoded in order: each passage sits in
    # the same batch (same neighbours, same padding) as with any other shard count.
    batches = read_rows(args.passages, "passages", order[aligned], ["passage_id", "title", "text"])
    texts = encoder_texts(batches, tokenizer.sep_token or "|")
    ids = batches["passage_id"].iloc[rows.start - aligned.start : rows.stop - aligned.start].tolist()
    del batches  # the texts are all that is encoded
    # a model that ships a passage prompt is fed it, as sentence-transformers' encode_document
    prompt = model_prompts(args.model)["passage"]
    emb = encode_texts(
        with_prompt(list(texts), prompt),
        tokenizer,
        model.encode_passage,
        args.max_length,
        batch_size=args.batch_size,
        sort_by_length=False,
        device=device,
        autocast=None if precision == "fp32" else precision,
    )
    emb = emb[rows.start - aligned.start : rows.stop - aligned.start]
    write_embeddings(args.out, ids, emb, precision=precision)
    log.info(
        "shard %d/%d: %d passages, dimension %d, %s pooling, %s similarity (%s), precision %s on %s, prompt %r",
        args.shard,
        args.num_shards,
        len(ids),
        emb.shape[1],
        model.pooling,
        model.similarity,
        model.source,
        precision,
        device,
        prompt,
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, encode, argv, "encode_corpus")


if __name__ == "__main__":
    sys.exit(main())
