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

import torch

from dprflow.cli import StageError, run_stage
from dprflow.model_init import load_tokenizer
from dprflow.pretraining.contriever.data import PAIR_MODES, PairMaker, first_tokens, stream_documents
from dprflow.pretraining.contriever.model import NEGATIVE_MODES, Contriever, ContrieverConfig
from dprflow.pretraining.corpus import GENERIC_SOURCES, read_generic_documents, read_passages_documents
from dprflow.training import distributed
from dprflow.training.trainer import OptimArgs, set_seed, train_and_save

log = logging.getLogger("dprflow.pretrain_contriever")

MIN_DOC_TOKENS = 2  # ICT needs a span and a non-empty rest; cropping needs one token per view


@dataclass(kw_only=True)
class Args(OptimArgs):
    """Contriever contrastive pre-training on a collection's documents."""

    init: str = field(metadata={"help": "encoder to start from: folder, packaged name or hub id"})
    passages: str | None = field(
        default=None,
        metadata={"help": "passages.parquet of the collection (documents: grouped by doc_id)"},
    )
    corpus: str | None = field(
        default=None,
        metadata={
            "help": "pre-train on this generic corpus instead of --passages (Contriever Appendix A: "
            "Wikipedia, CCNet), with --corpus-path",
            "choices": list(GENERIC_SOURCES),
        },
    )
    corpus_path: str | None = field(default=None, metadata={"help": "--corpus's jsonl or passages.parquet"})
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


def pretrain(args: Args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.init)
    min_tokens = 1 if args.documents == "stream" else MIN_DOC_TOKENS
    if args.corpus:
        docs, counts = read_generic_documents(args.corpus, args.corpus_path, tokenizer, min_tokens)
    else:
        docs, counts = read_passages_documents(args.passages, tokenizer, min_tokens)
    source = args.corpus_path or args.corpus or args.passages
    if args.documents == "stream":
        docs, stream_counts = stream_documents(docs, args.max_doc_tokens, MIN_DOC_TOKENS)
        counts.update(stream_counts)
        for key, value in stream_counts.items():
            log.info("%s: %d", key, value)
    else:
        docs = first_tokens(docs, args.max_doc_tokens)
    if len(docs) < args.batch_size and args.documents == "stream":
        raise StageError(
            f"{source}: its {counts['stream_tokens']} tokens make {len(docs)} documents of "
            f"{args.max_doc_tokens} tokens, fewer than one batch of {args.batch_size}; lower "
            "--batch-size or --max-doc-tokens, or add documents"
        )
    if len(docs) < args.batch_size:
        raise StageError(
            f"{source}: {len(docs)} documents of at least {MIN_DOC_TOKENS} tokens "
            f"({counts['documents_too_short_skipped']} too short skipped) are fewer than one batch of "
            f"{args.batch_size}; lower --batch-size or add documents"
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
    if positions is not None and args.max_doc_tokens + 2 > positions:
        raise StageError(
            f"--max-doc-tokens {args.max_doc_tokens} plus [CLS] and [SEP] exceeds the {positions} positions "
            f"of {args.init}; use --max-doc-tokens {positions - 2} or less"
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
