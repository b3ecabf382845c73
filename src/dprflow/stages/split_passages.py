"""Stage ``split_passages``: documents become passages of at most N tokens (whole sentences grouped)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.passages import BatchCounter, split_documents
from dprflow.data.schemas import TableWriter, iter_table
from dprflow.errors import StageError
from dprflow.models.init import load_tokenizer

log = logging.getLogger("dprflow.split_passages")


@dataclass
class Args:
    """Cut documents into passages with the model's tokenizer."""

    documents: str = field(metadata={"help": "documents.parquet"})
    out: str = field(metadata={"help": "passages.parquet to write"})
    model: str = field(metadata={"help": "model.init whose tokenizer counts tokens"})
    max_tokens: int = field(default=144, metadata={"help": "passage length limit in tokens"})
    batch_documents: int = field(
        default=4096, metadata={"help": "documents read, cut and written at a time (bounds memory)"}
    )

    def check(self) -> None:
        if self.batch_documents < 1:
            raise ValueError(f"--batch-documents must be at least 1, got {self.batch_documents}")


def split(args: Args) -> None:
    # Streamed by batches of documents: one batch of documents and its passages in memory; every
    # document is cut on its own, so the table is the one a single whole-table call gives.
    # One counter for every batch: its word counts carry over (see BatchCounter).
    tokenizer = BatchCounter(load_tokenizer(args.model))
    log.info("token counts add up over words (each distinct word tokenized once): %s", tokenizer.additive)
    counts: dict[str, int] = {}
    tokens_sum = tokens_max = 0
    with TableWriter(args.out, "passages") as writer:
        for documents in iter_table(args.documents, "documents", batch_rows=args.batch_documents):
            passages, batch_counts = split_documents(documents, tokenizer, args.max_tokens)
            writer.write(passages)
            for key, n in batch_counts.items():
                counts[key] = counts.get(key, 0) + n
            if len(passages):
                tokens_sum += int(passages["n_tokens"].sum())
                tokens_max = max(tokens_max, int(passages["n_tokens"].max()))
        if not writer.rows:
            raise StageError(f"{args.documents}: no document has any text; no passages to write")
    for key, n in counts.items():
        log.info("count %s: %d", key, n)
    log.info("tokens per passage: mean %.1f, max %d", tokens_sum / writer.rows, tokens_max)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, split, argv, "split_passages")


if __name__ == "__main__":
    sys.exit(main())
