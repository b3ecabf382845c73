"""scripts/heldout_split.py: the held-out copy of a BEIR folder holds training queries only."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "heldout_split.py"


def qrels_queries(path: Path) -> set[str]:
    with path.open(newline="") as fh:
        return {row[0] for row in list(csv.reader(fh, delimiter="\t"))[1:]}


def test_heldout_copy_splits_the_training_queries_and_leaves_the_test_queries_out(tmp_path):
    source = tmp_path / "beir"
    (source / "qrels").mkdir(parents=True)
    (source / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "", "text": "x"}) + "\n")
    train = [f"t{i}" for i in range(10)]
    test = ["s1", "s2"]
    (source / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": q}) + "\n" for q in train + test)
    )
    head = "query-id\tcorpus-id\tscore\n"
    (source / "qrels" / "train.tsv").write_text(head + "".join(f"{q}\td1\t1\n{q}\td2\t2\n" for q in train))
    (source / "qrels" / "test.tsv").write_text(head + "".join(f"{q}\td1\t1\n" for q in test))

    def split(out: Path) -> tuple[set[str], set[str]]:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(source), str(out)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert "8 fit queries" in done.stdout and "2 held out" in done.stdout
        return qrels_queries(out / "qrels" / "train.tsv"), qrels_queries(out / "qrels" / "dev.tsv")

    fit, held = split(tmp_path / "a")
    assert len(fit) == 8 and len(held) == 2 and fit | held == set(train) and not fit & held
    # Both qrels lines of a query stay together.
    rows = (tmp_path / "a" / "qrels" / "dev.tsv").read_text().splitlines()[1:]
    assert len(rows) == 4
    # No test query reaches the copy.
    copied = {json.loads(x)["_id"] for x in (tmp_path / "a" / "queries.jsonl").read_text().splitlines()}
    assert copied == set(train)
    assert not (tmp_path / "a" / "qrels" / "test.tsv").exists()
    # The same seed gives the same split.
    assert split(tmp_path / "b") == (fit, held)
