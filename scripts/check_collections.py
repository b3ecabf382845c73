"""Load the real collections beside the checkout with dprflow's BEIR loader and compare what it
reads with each collection's known figures: a check for developers, run by hand, never by the tests
(which pass on a clone with nothing beside it).

Prints a line per figure, OK or FAIL, then how many figures were OK, and exits 1 on a FAIL. A
collection the loader cannot read (a file it needs missing, malformed JSON, a byte that is not
UTF-8, an empty file) is one FAIL line naming the file, and the line where known; the check goes on
to the next collection. A collection whose folder is not in the root is named and passed over, as
long as another one is checked: a root that does not exist, or holds none of the collections, is
an error (exit 2), since then nothing was checked.

    python scripts/check_collections.py                 # ../shared/collections
    python scripts/check_collections.py path/to/collections
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dprflow.data.collections.beir import SPLITS, CollectionError, load_beir

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


def required_files(folder: Path, expected: dict[str, object]) -> list[Path]:
    """The files ``folder`` must hold: the corpus, the queries, and the qrels file of each split
    whose query count is expected (the loader needs only one qrels file, so it would not say one is gone)."""
    splits = [s for s in SPLITS if f"queries_{s}" in expected]
    return [folder / "corpus.jsonl", folder / "queries.jsonl"] + [
        folder / "qrels" / f"{s}.tsv" for s in splits
    ]


def figures(folder: Path) -> dict[str, object]:
    """The loader's counts of ``folder``, and the relevance levels its judgements use."""
    collection = load_beir(folder)
    levels = sorted(int(r) for r in collection.qrels["relevance"].unique())
    return {**collection.counts, "relevance levels": levels}


def check(folder: Path, expected: dict[str, object]) -> list[tuple[str, bool, str]]:
    """``(figure, ok, what was read against what was expected)`` for each expected figure.

    Raises :class:`CollectionError` naming the files missing from ``folder``, or the file and
    line the loader could not read.
    """
    missing = [str(path) for path in required_files(folder, expected) if not path.is_file()]
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise CollectionError(
            f"missing {', '.join(missing)}; the expected figures are read from {them}: restore {them}"
        )
    found = figures(folder)
    return [
        (
            name,
            found.get(name) == want,
            f"{found[name]} (expected {want})"
            if name in found
            else f"not among the loader's figures (expected {want})",
        )
        for name, want in expected.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "root", nargs="?", default=Path(__file__).resolve().parents[2] / "shared" / "collections"
    )
    root = Path(parser.parse_args(argv).root)
    names = ", ".join(EXPECTED)
    if not root.is_dir():
        print(f"error: {root}: no such folder; give the folder that holds {names}", file=sys.stderr)
        return 2
    present = [name for name in EXPECTED if (root / name).exists()]
    if not present:
        print(
            f"error: {root} holds none of {names}, so nothing was checked; give the folder that holds them",
            file=sys.stderr,
        )
        return 2
    failed = ok_figures = all_figures = 0
    for name, expected in EXPECTED.items():
        if name not in present:
            print(f"{name}: not in {root}, passed over")
            continue
        all_figures += len(expected)
        try:
            results = check(root / name, expected)
        except (CollectionError, OSError) as exc:
            failed += 1
            print(f"{name}: FAIL {exc}")
            continue
        for figure, ok, detail in results:
            failed += not ok
            ok_figures += ok
            print(f"{name} {figure}: {'OK' if ok else 'FAIL'} {detail}")
    print(f"{ok_figures} of {all_figures} figures OK ({len(present)} of {len(EXPECTED)} collections present)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
