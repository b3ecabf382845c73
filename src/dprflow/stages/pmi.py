"""Stage ``pmi``: merge the shard counts of stage ``pmi_count`` into a corpus's n-gram statistics.

The result (``ngram_counts`` Parquet: per-order totals and the count of every n-gram, n >= 2
pruned below ``min_count`` once, here) is the compact table CDMAE's importance-aware masking reads:
:func:`dprflow.pretraining.mae.pmi.token_importance` turns it into each token's AMI (CDMAE eq. 7-8) when a
pre-training stage builds its batches. Merging copies each shard into memory-mapped arrays,
combines them key range by key range and writes each range as it is done
(:func:`dprflow.pretraining.mae.pmi.write_merged`), so memory is bounded by one key range of every
shard, neither by the shards nor by the result.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.pretraining.mae import pmi

log = logging.getLogger("dprflow.pmi")


@dataclass
class Args:
    """Merge n-gram counts of shards into one table."""

    counts: list[str] = field(metadata={"help": "ngram_counts tables of the shards"})
    out: str = field(metadata={"help": "merged ngram_counts table"})
    min_count: int = field(default=1, metadata={"help": "drop n-grams (n >= 2) seen fewer times"})
    spill_dir: str | None = field(default=None, metadata={"help": "folder for memory-mapped runs"})


def merge(args: Args) -> None:
    totals, distinct = pmi.write_merged(
        args.counts, args.out, min_count=args.min_count, spill_dir=args.spill_dir
    )
    log.info(
        "%d shard(s): n-gram occurrences per order %s; distinct kept per order %s (min_count %d)",
        len(args.counts),
        totals[1:].tolist(),
        distinct[1:].tolist(),
        args.min_count,
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, merge, argv, "pmi")


if __name__ == "__main__":
    sys.exit(main())
