"""Stage ``pretrain_tokenize``: a corpus tokenized once per tokenizer and view into a token store.

Every pre-training method reads its corpus from a store (:mod:`dprflow.data.token_store`) and cuts
its spans, windows, chunks and pairs from it per batch. The texts are read and tokenized
``batch_texts`` at a time and appended to the store, so memory does not grow with the corpus; the
store is written to a temporary folder and renamed on success. Views
(:data:`dprflow.pretraining.documents.VIEWS`): ``documents``, ``passages``, ``document-sentences``
(a collection's passages.parquet) and ``texts``, ``text-sentences`` (the generic corpus).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.documents import VIEWS, CorpusArgs, tokenize_view

log = logging.getLogger("dprflow.pretrain_tokenize")


@dataclass
class Args(CorpusArgs):
    """Tokenize a corpus into a token store."""

    tokenizer: str = field(metadata={"help": "the tokenizer's model: folder, packaged name or hub id"})
    view: str = field(metadata={"help": "what a document of the store is", "choices": list(VIEWS)})
    out: str = field(metadata={"help": "token store folder to write"})
    batch_texts: int = field(default=1024, metadata={"help": "texts tokenized at a time"})

    def check(self) -> None:
        if self.view in ("texts", "text-sentences"):
            self.check_corpus()  # the generic corpus; the other views read --corpus-path's passages
        if self.view not in ("texts", "text-sentences") and not self.corpus_path:
            raise ValueError(f"--view {self.view} reads a passages.parquet: give --corpus-path")
        if self.batch_texts < 1:
            raise ValueError("--batch-texts must be >= 1")


def tokenize(args: Args) -> None:
    store = tokenize_view(
        args.view,
        args.out,
        load_tokenizer(args.tokenizer),
        args.corpus_path,
        args.corpus,
        batch_texts=args.batch_texts,
    )
    log.info("%s: %d documents, %d tokens (%s)", args.out, len(store), store.n_tokens, store.meta["dtype"])


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, tokenize, argv, "pretrain_tokenize")


if __name__ == "__main__":
    sys.exit(main())
