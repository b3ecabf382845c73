"""A held-out copy of a BEIR folder for choosing settings without the test queries.

The training queries (those judged in ``qrels/<split>.tsv``, default ``train``) are split in a
seeded random order: ``fraction`` of them (rounded, at least one) become ``qrels/dev.tsv``, the
rest ``qrels/train.tsv``. The copy's ``queries.jsonl`` holds the training queries only, so a run on
it cannot read a test query; ``corpus.jsonl`` is linked, not copied. Cranfield's 151 training
queries give 121 fit / 30 held out at the default 0.2 and seed 13, CISI's 51 give 41 / 10.

Run it on a collection, then point a config's collection at the copy with ``eval_split: dev``
(docs/methods-study.md):

    python scripts/heldout_split.py ../shared/collections/cranfield results/heldout/cranfield
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
from pathlib import Path


def heldout_ids(query_ids: list[str], fraction: float, seed: int) -> set[str]:
    """``round(fraction * n)`` (at least 1, at most n - 1) of the ids, in a seeded random order."""
    ids = sorted(set(query_ids))
    if len(ids) < 2:
        raise ValueError(f"{len(ids)} training queries: nothing to hold out")
    n_held = min(len(ids) - 1, max(1, round(fraction * len(ids))))
    return set(random.Random(seed).sample(ids, n_held))


def read_qrels(path: Path) -> list[list[str]]:
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    return rows[1:]


def write_heldout(source: Path, out: Path, split: str, fraction: float, seed: int) -> tuple[int, int]:
    """Write the held-out copy; returns (fit queries, held-out queries)."""
    rows = read_qrels(source / "qrels" / f"{split}.tsv")
    held = heldout_ids([r[0] for r in rows], fraction, seed)
    training = {r[0] for r in rows}
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    for name, keep in (("train", lambda q: q not in held), ("dev", lambda q: q in held)):
        with (out / "qrels" / f"{name}.tsv").open("w", newline="") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
            writer.writerow(["query-id", "corpus-id", "score"])
            writer.writerows(r for r in rows if keep(r[0]))
    with (source / "queries.jsonl").open() as src, (out / "queries.jsonl").open("w") as dst:
        for line in src:
            if line.strip() and json.loads(line)["_id"] in training:
                dst.write(line)
    corpus = out / "corpus.jsonl"
    if not corpus.exists():
        os.symlink((source / "corpus.jsonl").resolve(), corpus)
    return len(training) - len(held), len(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a BEIR folder")
    parser.add_argument("out", type=Path, help="the held-out copy to write")
    parser.add_argument("--split", default="train", help="the training split to divide")
    parser.add_argument("--fraction", type=float, default=0.2, help="share of its queries held out")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    fit, held = write_heldout(args.source, args.out, args.split, args.fraction, args.seed)
    print(f"{args.out}: {fit} fit queries (qrels/train.tsv), {held} held out (qrels/dev.tsv)")


if __name__ == "__main__":
    main()
