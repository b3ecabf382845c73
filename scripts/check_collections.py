"""Load the real collections beside the checkout with dprflow's BEIR loader and compare what it
reads with each collection's known figures: a check for developers, run by hand, never by the tests
(which pass on a clone with nothing beside it). Prints a line per figure, OK or FAIL, and exits 1 on
a FAIL; a collection that is not there is named and passed over.

    python scripts/check_collections.py                 # ../shared/collections
    python scripts/check_collections.py path/to/collections
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dprflow.data.collections.beir import load_beir

# What each collection holds, as the loader reads it (docs/collections.md, docs/methods-study.md).
# Cranfield has two empty documents (ids 471 and 995), CISI 36 queries no file judges.
EXPECTED = {
    "cranfield": {
        "documents": 1400,
        "documents_empty": 2,
        "queries_train": 151,
        "queries_test": 74,
        "queries_unjudged": 0,
        "qrels": 1612,
        "relevance levels": [1, 2, 3, 4],
    },
    "cisi": {
        "documents": 1460,
        "documents_empty": 0,
        "queries_train": 51,
        "queries_test": 25,
        "queries_unjudged": 36,
        "qrels": 3114,
        "relevance levels": [1],
    },
    "scifact": {
        "documents": 5183,
        "documents_empty": 0,
        "queries_train": 809,
        "queries_test": 300,
        "queries_unjudged": 0,
        "qrels": 1258,
        "relevance levels": [1],
    },
}


def figures(folder: Path) -> dict[str, object]:
    """The loader's counts of ``folder``, and the relevance levels its judgements use."""
    collection = load_beir(folder)
    levels = sorted(int(r) for r in collection.qrels["relevance"].unique())
    return {**collection.counts, "relevance levels": levels}


def check(folder: Path, expected: dict[str, object]) -> list[tuple[str, bool, str]]:
    """``(figure, ok, what was read against what was expected)`` for each expected figure."""
    found = figures(folder)
    return [
        (name, found.get(name) == want, f"{found.get(name)} (expected {want})")
        for name, want in expected.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "root", nargs="?", default=Path(__file__).resolve().parents[2] / "shared" / "collections"
    )
    root = Path(parser.parse_args(argv).root)
    failed = 0
    for name, expected in EXPECTED.items():
        if not (root / name / "corpus.jsonl").is_file():
            print(f"{name}: not in {root}, passed over")
            continue
        for figure, ok, detail in check(root / name, expected):
            failed += not ok
            print(f"{name} {figure}: {'OK' if ok else 'FAIL'} {detail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
