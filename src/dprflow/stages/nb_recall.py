"""Stage ``nb_recall``: neighbourhood recall nb-recall^n@k of retriever 1 against retriever 2
(coCondenser section 5.2)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.data.schemas import read_table, write_table
from dprflow.search.dense import nb_recall_table

log = logging.getLogger("dprflow.nb_recall")


@dataclass
class Args:
    """How much of retriever 2's top n retriever 1's top k covers."""

    run_r1: str = field(metadata={"help": "retriever-1 run.parquet"})
    run_r2: str = field(metadata={"help": "retriever-2 run.parquet"})
    out: str = field(metadata={"help": "nb_recall.parquet to write"})
    n: list[int] = field(default_factory=lambda: [50, 100], metadata={"help": "neighbourhood sizes"})
    k: list[int] = field(default_factory=lambda: [10, 50, 100, 200, 500, 1000], metadata={"help": "depths"})


def measure(args: Args) -> None:
    table = nb_recall_table(read_table(args.run_r1, "run"), read_table(args.run_r2, "run"), args.n, args.k)
    write_table(table[["n", "k", "value"]], args.out, "nb_recall")
    for row in table.itertuples(index=False):
        log.info("nb-recall^%d@%d = %.4f", row.n, row.k, row.value)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, measure, argv, "nb_recall")


if __name__ == "__main__":
    sys.exit(main())
