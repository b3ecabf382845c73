"""dprflow.plan.rows: a row's name is made, parsed and ordered by one module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dprflow.plan import rows

ROOT = Path(__file__).resolve().parents[1]


def test_names_are_made_from_their_parts():
    assert rows.zeroshot("contriever") == "contriever/zeroshot"
    assert rows.trained("none", 13, "r2") == "none/seed-13/r2"
    assert rows.fused(rows.trained("none", 13, "r2")) == "none/seed-13/r2+bm25"
    assert rows.transfer("none/seed-13/r2", "cisi") == "none/seed-13/r2/on-cisi"
    assert rows.REFERENCE_PREFIX + "bge" == "ref-bge"


@pytest.mark.parametrize(
    ("name", "row", "target"),
    [
        ("none/seed-13/r2/on-cisi", "none/seed-13/r2", "cisi"),
        ("seed-13/r2/on-cisi", "seed-13/r2", "cisi"),  # a retriever folder below its method
        ("contriever/zeroshot/on-scifact_2", "contriever/zeroshot", "scifact_2"),
        ("none/seed-13/r2", "none/seed-13/r2", None),
        ("bm25", "bm25", None),
        ("none/seed-13/on-x/r2", "none/seed-13/on-x/r2", None),  # on- only as the last part
    ],
)
def test_split_transfer(name, row, target):
    assert rows.split_transfer(name) == (row, target)


def test_seeds_are_split_and_folded_away():
    assert rows.split_seed("none/seed-13/r2") == ("none/r2", 13)
    assert rows.split_seed("none/seed-13/r2+bm25") == ("none/r2+bm25", 13)
    assert rows.split_seed("none/zeroshot") == ("none/zeroshot", None)
    assert rows.split_seed("none/seed-x/r2") == ("none/seed-x/r2", None)
    assert rows.without_seed("none/seed-13/r2/on-cisi") == "none/r2/on-cisi"
    assert rows.without_seed("cocondenser/seed-7/distill+bm25") == "cocondenser/distill+bm25"
    assert rows.without_seed("bm25") == "bm25"


def test_which_rows_are_dense_and_fused():
    dense = ["none/zeroshot", "none/seed-13/r1", "none/seed-13/distill/on-cisi", "ref-bge/zeroshot"]
    other = ["bm25", "none/seed-13/rerank", "none/seed-13/rerank/on-cisi", "none/seed-13/r2+bm25"]
    assert all(rows.is_dense(n) for n in dense) and not any(rows.is_dense(n) for n in other)
    assert rows.is_fused("none/zeroshot+bm25") and not rows.is_fused("none/zeroshot")
    assert rows.unfused("none/seed-13/r2+bm25") == "none/seed-13/r2"


def test_the_table_order():
    names = [
        "cocondenser/distill",
        "none/r2+bm25",
        "cocondenser/zeroshot",
        "none/r2",
        "none/zeroshot",
        "cocondenser/r1",
        "bm25",
        "other/r1",
    ]
    ordered = sorted(names, key=lambda n: rows.sort_key(n, ["none", "cocondenser"]))
    assert ordered == [
        "bm25",
        "none/zeroshot",
        "none/r2",
        "none/r2+bm25",
        "cocondenser/zeroshot",
        "cocondenser/r1",
        "cocondenser/distill",
        "other/r1",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "bm25",
        "none/zeroshot",
        "ref-bge-small/zeroshot+bm25",
        "none/seed-13/r1",
        "cocondenser/seed-2/distill+bm25",
        "none/seed-13/r2/on-cisi",
        "contriever/zeroshot/on-scifact",
    ],
)
def test_every_row_matches_the_wildcard_pattern(name):
    assert re.fullmatch(rows.system_pattern(), name)
    parts = [rows.split_transfer(name)[0], rows.unfused(rows.split_transfer(name)[0])]
    assert all(re.fullmatch(rows.system_pattern(), p) for p in parts)


@pytest.mark.parametrize(
    "name",
    ["bm25+bm25", "none/seed-13/select/lr", "none/r2", "none/seed-13/r3", "none/seed-13/r2/on-", "a/b/c/d"],
)
def test_other_names_do_not(name):
    assert not re.fullmatch(rows.system_pattern(), name)


def test_no_other_module_spells_the_grammar():
    """The row names' literals live in dprflow.plan.rows only; the rules' output paths spell the
    seed's and the transfer's folders through it too (common.smk's SEED_DIR, TRANSFER_DIR)."""
    literals = re.compile(r"""["'](\+bm25|on-|seed-|ref-|none/zeroshot)""")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "src" / "dprflow").rglob("*.py")
        if path != ROOT / "src" / "dprflow" / "plan" / "rows.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if literals.search(line.split("#")[0])
    ]
    folders = re.compile(r"seed-|on-\{|/on-|zeroshot\|")
    found += [
        f"{path.relative_to(ROOT)}:{n}"
        for path in [ROOT / "Snakefile", *sorted((ROOT / "rules").rglob("*.smk"))]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if folders.search(line.split("#")[0])
    ]
    assert found == []
