"""Stage ``split_passages``: documents become passages of at most N tokens (whole sentences grouped)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import StageError, run_stage
from dprflow.data.passages import split_documents
from dprflow.data.schemas import read_table, write_table
from dprflow.model_init import load_tokenizer

log = logging.getLogger("dprflow.split_passages")


@dataclass
class Args:
    """Cut documents into passages with the model's tokenizer."""

    documents: str = field(metadata={"help": "documents.parquet"})
    out: str = field(metadata={"help": "passages.parquet to write"})
    model: str = field(metadata={"help": "model.init whose tokenizer counts tokens"})
    max_tokens: int = field(default=144, metadata={"help": "passage length limit in tokens"})


def split(args: Args) -> None:
    documents = read_table(args.documents, "documents")
    passages, counts = split_documents(documents, load_tokenizer(args.model), args.max_tokens)
    if passages.empty:
        raise StageError(f"{args.documents}: no document has any text; no passages to write")
    write_table(passages, args.out, "passages")
    for key, n in counts.items():
        log.info("count %s: %d", key, n)
    log.info("tokens per passage: mean %.1f, max %d", passages["n_tokens"].mean(), passages["n_tokens"].max())


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, split, argv, "split_passages")


if __name__ == "__main__":
    sys.exit(main())
