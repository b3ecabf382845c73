"""Stage ``pmi_count``: word n-gram counts (n = 1..L) of one shard of a pre-training corpus.

CDMAE §3.2 estimates token importance from corpus n-gram statistics. The corpus (a collection's
passages, or the generic corpus of stage one) is cut into ``shards`` contiguous ranges of texts;
each shard is one job, counted by streaming and written key range by key range
(:func:`dprflow.pretraining.mae.pmi.write_shard_counts`), so memory is bounded by ``max_distinct``
(at most about 24 bytes each) and one batch of texts, not by the corpus or the shard's distinct
n-grams. Stage ``pmi`` merges the shards; counts are never pruned here, so one shard or many give
identical statistics.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.pretraining.documents import CorpusArgs, count_generic_texts, iter_generic_texts
from dprflow.pretraining.mae import pmi

log = logging.getLogger("dprflow.pmi_count")


@dataclass
class Args(CorpusArgs):
    """Count the word n-grams of one shard of a corpus."""

    out: str = field(metadata={"help": "ngram_counts Parquet table of this shard"})
    shard: int = field(default=0, metadata={"help": "this shard's index, 0-based"})
    shards: int = field(default=1, metadata={"help": "number of shards"})
    max_n: int = field(default=pmi.DEFAULT_MAX_N, metadata={"help": "largest n-gram order L (CDMAE: 4)"})
    max_distinct: int = field(
        default=1 << 25,
        metadata={
            "help": "distinct n-grams held in memory before spilling to disk: 16 bytes each (key and "
            "count), up to 24 while runs are combined; peak RSS about 290 MB + 24 B x this"
        },
    )
    spill_dir: str | None = field(default=None, metadata={"help": "folder for spilled runs (default: temp)"})

    def check(self) -> None:
        self.check_corpus()
        if not 0 <= self.shard < self.shards:
            raise ValueError(f"--shard {self.shard} is outside 0..{self.shards - 1}")


def shard_range(n_texts: int, shard: int, shards: int) -> tuple[int, int]:
    """The texts ``[start, stop)`` of one of ``shards`` contiguous, near-equal shards."""
    return n_texts * shard // shards, n_texts * (shard + 1) // shards


def count(args: Args) -> None:
    # The shard's texts are streamed (a Parquet corpus: from the row group holding its first row),
    # never the whole corpus in memory: counting holds the n-gram runs only.
    n_texts = count_generic_texts(args.corpus, args.corpus_path)
    start, stop = shard_range(n_texts, args.shard, args.shards)
    texts = iter_generic_texts(args.corpus, args.corpus_path, start, stop)
    totals, distinct = pmi.write_shard_counts(
        texts, args.out, args.max_n, max_distinct=args.max_distinct, spill_dir=args.spill_dir
    )
    log.info(
        "shard %d/%d: texts %d..%d of %d; n-gram occurrences per order %s; distinct %s",
        args.shard,
        args.shards,
        start,
        stop,
        n_texts,
        totals[1:].tolist(),
        distinct[1:].tolist(),
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, count, argv, "pmi_count")


if __name__ == "__main__":
    sys.exit(main())
