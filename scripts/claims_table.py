"""The claims table of the methods study (docs/methods-study.md) from one run's compare.csv.

Each claim the papers make is a list of comparisons, each a row, the reference row it is compared
with (a column pair ``delta_<ref>``, ``p_<ref>`` of compare.csv: the reference is in the config's
``evaluation.baseline``, ``none/zeroshot`` or ``evaluation.also_against``), and a metric. For every
comparison and collection the table gives both values (with several seeds, their mean ± sample
standard deviation), the difference and the Holm-corrected p-value the compare stage computed
(paired over the test queries; with several seeds, the test over queries and seeds of
dprflow.evaluation.crossed; corrected over the rows of the same collection, metric and
reference), and a verdict at the 0.05 level, fixed before the run:

- a claim that the row is above the reference: **holds** when the row is significantly above,
  **opposite** when significantly below, **not shown** otherwise;
- a claim that the row is close to the reference (unsupervised Contriever against BM25):
  **opposite** when the row is significantly below, **holds** otherwise.

Beside each verdict, the smallest difference the design would have found (compare.csv's
``mdd_<ref>``: power 0.8 at Holm's strictest threshold, over queries and seeds): "not shown"
means no difference that large, not no difference.

SciFact (the collection the rows were trained on) decides the verdict; Cranfield and CISI, scored
with the models trained on SciFact, are shown beside it (transfer).

    python scripts/claims_table.py results/compare.csv > claims.md
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ALPHA = 0.05


@dataclass(frozen=True)
class Comparison:
    row: str
    reference: str
    metric: str = "nDCG@10"
    kind: str = "above"  # or "close"


@dataclass(frozen=True)
class Claim:
    text: str
    paper: str
    comparisons: tuple[Comparison, ...]


CLAIMS = (
    Claim(
        "Condenser readies BERT for low-data fine-tuning (Condenser Tables 3 and 5)",
        "MS MARCO, 1K training queries: MRR@10 0.156 (BERT), 0.192 (Condenser); NQ Top-20 66.6, 72.7",
        (Comparison("condenser/r1", "none/r1"),),
    ),
    Claim(
        "Corpus-aware span pre-training beats Condenser after the same fine-tuning (coCondenser Table 5)",
        "MS MARCO MRR@10, BM25 negatives: 33.8 (Condenser), 35.7 (coCondenser); mined: 36.6, 38.2",
        (Comparison("cocondenser/r1", "condenser/r1"), Comparison("cocondenser/r2", "none/r2")),
    ),
    Claim(
        "Contriever fine-tuned on SciFact's training queries beats BERT fine-tuned (Contriever Table 2)",
        "SciFact nDCG@10: 75.2 (BERT), 84.0 (Contriever)",
        (Comparison("contriever/r1", "none-mean/r1"), Comparison("contriever/r1", "none/r1")),
    ),
    Claim(
        "Fine-tuned on SciFact's training queries, both beat BM25 (Contriever Table 2)",
        "SciFact nDCG@10: BM25 66.5; BERT 75.2, Contriever 84.0",
        (Comparison("none/r1", "bm25"), Comparison("contriever/r1", "bm25")),
    ),
    Claim(
        "Unsupervised Contriever is close to BM25 in R@100 (Contriever section 1, Table 7)",
        "competitive with BM25 on most of BEIR (R@100)",
        (Comparison("contriever/zeroshot", "bm25", "R@100", "close"),),
    ),
    Claim(
        "The objective, not the text: each corpus-aware pre-training above plain MLM on the same text for"
        " the same budget (issue 54's control; no seed paper runs it)",
        "GPL Table 1, SciFact nDCG@10 after pre-training on SciFact, then the same MS MARCO fine-tuning:"
        " MLM 60.0, Condenser 62.7, TSDAE 62.8",
        tuple(Comparison(f"{m}/r1", "mlm/r1") for m in ("cocondenser", "bmae", "cdmae", "cotmae")),
    ),
    Claim(
        "CoT-MAE above coCondenser (CDMAE Table 2)",
        "MS MARCO MRR@10, BM25 negatives: 36.8 against 35.7; mined: 39.2 against 38.2",
        (Comparison("cotmae/r1", "cocondenser/r1"), Comparison("cotmae/r2", "cocondenser/r2")),
    ),
    Claim(
        "CDMAE's importance-aware decoder masking above BMAE's random masking (CDMAE Table 2)",
        "MS MARCO MRR@10, BM25 negatives: 38.8 against 37.7 (RetroMAE as BMAE)",
        (Comparison("cdmae/r1", "bmae/r1"),),
    ),
    Claim(
        "Query-as-context above its base method (query-as-context Table 1)",
        "MS MARCO MRR@10 of retriever 2: +0.6 (coCondenser), +1.4 (CoT-MAE, 40.2)",
        (Comparison("qac-cocondenser/r1", "cocondenser/r1"), Comparison("qac-cotmae/r1", "cotmae/r1")),
    ),
    Claim(
        "Retriever 2 above retriever 1 (coCondenser Table 5)",
        "MS MARCO MRR@10: 35.7 (retriever 1) against 38.2 (retriever 2), coCondenser",
        (
            Comparison("none/r2", "none/r1"),
            Comparison("cocondenser/r2", "cocondenser/r1"),
            Comparison("cotmae/r2", "cotmae/r1"),
        ),
    ),
)


def verdict(delta: float, p: float, kind: str) -> str:
    significant = not math.isnan(p) and p < ALPHA
    if significant and delta < 0:
        return "opposite"
    if kind == "close":
        return "holds"
    return "holds" if significant else "not shown"


def value(table: pd.DataFrame, collection: str, system: str, metric: str) -> pd.Series:
    """compare.csv's row of ``system`` on the test queries of ``collection``."""
    rows = table[
        (table["collection"] == collection) & (table["system"] == system) & (table["metric"] == metric)
    ]
    if "training_queries" in rows:
        rows = rows[~rows["training_queries"].astype(str).str.lower().eq("true")]
    if len(rows) != 1:
        raise KeyError(f"compare.csv: {len(rows)} rows for {system} {metric} on {collection}, not one")
    return rows.iloc[0]


def shown(row: pd.Series) -> str:
    """A row's value; with several seeds, their mean ± sample standard deviation (n seeds)."""
    n = int(row["n_seeds"]) if "n_seeds" in row and not pd.isna(row["n_seeds"]) else 1
    if n < 2:
        return f"{float(row['value']):.4f}"
    return f"{float(row['value']):.4f} ± {float(row['std']):.4f} ({n} seeds)"


def comparison(table: pd.DataFrame, collection: str, c: Comparison) -> tuple[str, str, float, float, float]:
    """(row's value, reference's value, as :func:`shown`; difference, Holm-corrected p, detectable
    difference) on ``collection``; the detectable difference is NaN in a compare.csv written before
    it was."""
    key = c.reference.replace("/", "_")
    if f"p_{key}" not in table:
        raise KeyError(f"compare.csv has no p_{key}: add {c.reference} to evaluation.also_against")
    row, ref = value(table, collection, c.row, c.metric), value(table, collection, c.reference, c.metric)
    mdd = float(row[f"mdd_{key}"]) if f"mdd_{key}" in row else float("nan")
    return shown(row), shown(ref), float(row[f"delta_{key}"]), float(row[f"p_{key}"]), mdd


def claims_table(
    table: pd.DataFrame, main: str = "scifact", transfer: tuple[str, ...] = ("cranfield", "cisi")
) -> str:
    collections = [c for c in transfer if c in set(table["collection"])]
    head = [
        "claim",
        "paper's figures",
        "rows (metric)",
        f"{main}: row",
        "reference",
        "Δ",
        "Holm p",
        "verdict",
        "detectable Δ",
    ]
    head += [f"{c}: Δ (p)" for c in collections]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for claim in CLAIMS:
        for i, c in enumerate(claim.comparisons):
            a, b, delta, p, mdd = comparison(table, main, c)
            cells = [claim.text if i == 0 else "", claim.paper if i == 0 else ""]
            cells += [f"`{c.row}` against `{c.reference}` ({c.metric})", a, b]
            cells += [f"{delta:+.4f}", f"{p:.3g}", f"**{verdict(delta, p, c.kind)}**"]
            cells.append("–" if math.isnan(mdd) else f"{mdd:.4f}")
            for other in collections:
                _, _, d, q, _ = comparison(table, other, c)
                cells.append(f"{d:+.4f} ({q:.3g})")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compare", type=Path, help="a run's results/compare.csv")
    parser.add_argument("--collection", default="scifact", help="the collection the rows were trained on")
    parser.add_argument(
        "--transfer", nargs="*", default=["cranfield", "cisi"], help="collections scored in transfer"
    )
    args = parser.parse_args(argv)
    try:
        text = claims_table(pd.read_csv(args.compare), args.collection, tuple(args.transfer))
    except KeyError as exc:
        print(f"claims_table: {args.compare}: {exc.args[0]}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
