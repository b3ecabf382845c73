"""scripts/claims_table.py: every claim's rows and references are rows and references of the study's
config, and on a comparison table built by the compare stage's own code the verdicts follow the
differences and their Holm-corrected p-values."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from dprflow.evaluation.compare import build_comparison

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import claims_table  # noqa: E402

CONFIG = ROOT / "config" / "examples" / "methods-scifact-mlm.yaml"


def test_every_claim_compares_rows_the_study_scores_against_references_it_tests():
    config = yaml.safe_load(CONFIG.read_text())
    stages = config["finetune"]["stages_of"]
    rows = {f"{m}/{s}" for m in config["methods"] for s in stages.get(m, config["finetune"]["stages"])}
    rows |= {"bm25", "none/zeroshot", "contriever/zeroshot"}
    references = {config["evaluation"]["baseline"], "none/zeroshot", *config["evaluation"]["also_against"]}
    for claim in claims_table.CLAIMS:
        for c in claim.comparisons:
            assert c.row in rows and c.reference in rows, (claim.text, c)
            assert c.reference in references, (claim.text, c.reference)
            assert c.metric in config["evaluation"]["metrics"]


def per_query(offsets: dict[str, float], n: int = 40, seed: int = 0) -> dict[tuple[str, str], pd.DataFrame]:
    """Per-query tables on two collections: each system's values are a shared base per query plus
    its offset plus small noise."""
    rng = np.random.default_rng(seed)
    base = 0.2 + 0.5 * rng.random(n)
    tables = {}
    for collection in ("scifact", "cranfield"):
        for system, offset in offsets.items():
            values = np.clip(base + offset + rng.normal(0, 0.01, n), 0, 1)
            frames = [
                pd.DataFrame({"query_id": [f"q{i}" for i in range(n)], "metric": metric, "value": values})
                for metric in ("nDCG@10", "R@100")
            ]
            tables[(collection, system)] = pd.concat(frames, ignore_index=True)
    return tables


def test_verdicts_follow_the_differences_and_their_p_values(tmp_path):
    systems = {c.row for claim in claims_table.CLAIMS for c in claim.comparisons}
    systems |= {c.reference for claim in claims_table.CLAIMS for c in claim.comparisons}
    offsets = dict.fromkeys(systems | {"none/zeroshot"}, 0.0)
    offsets.update({"condenser/r1": 0.2, "cocondenser/r1": 0.0, "cdmae/r1": 0.0, "bmae/r1": 0.0})
    references = ["bm25", "none/zeroshot", *yaml.safe_load(CONFIG.read_text())["evaluation"]["also_against"]]
    table = build_comparison(per_query(offsets), references)
    path = tmp_path / "compare.csv"
    table.to_csv(path, index=False)
    text = claims_table.claims_table(pd.read_csv(path), transfer=("cranfield",))
    verdicts = {}
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        verdicts[cells[2].split(" (")[0]] = cells[7]
        assert float(cells[8]) > 0  # the detectable difference (compare.csv's mdd_<reference>)
    assert verdicts["`condenser/r1` against `none/r1`"] == "**holds**"  # +0.2 over 40 queries
    assert verdicts["`cocondenser/r1` against `condenser/r1`"] == "**opposite**"  # -0.2
    assert verdicts["`cdmae/r1` against `bmae/r1`"] == "**not shown**"  # noise only
    assert verdicts["`contriever/zeroshot` against `bm25`"] == "**holds**"  # close: no difference
    assert len(verdicts) == sum(len(c.comparisons) for c in claims_table.CLAIMS)
    assert "cranfield: Δ (p)" in text.splitlines()[0]


def test_a_reference_missing_from_the_table_is_named(tmp_path):
    table = build_comparison(per_query({"condenser/r1": 0.1, "none/r1": 0.0, "bm25": 0.0}), ["bm25"])
    table.to_csv(tmp_path / "compare.csv", index=False)
    assert claims_table.main([str(tmp_path / "compare.csv")]) == 1
    with pytest.raises(KeyError, match="p_none_r1: add none/r1 to evaluation.also_against"):
        claims_table.claims_table(table)


def test_a_row_with_seeds_shows_its_mean_and_spread(tmp_path):
    """Rows fine-tuned with three seeds (seeds_of) show mean ± sample standard deviation and their
    count; a row with one seed shows its value alone."""
    tables = per_query({"bm25": 0.0, "condenser/seed-13/r1": 0.05})
    for seed, shift in ((13, 0.0), (14, 0.02), (15, 0.04)):
        for system, offset in (("mlm", 0.0), ("cocondenser", 0.1)):
            seeded = per_query({f"{system}/seed-{seed}/r1": offset + shift}, seed=seed)
            tables.update(seeded)
    table = build_comparison(tables, ["bm25", "mlm/r1", "condenser/r1"])
    a, b, delta, p, _ = claims_table.comparison(
        table, "scifact", claims_table.Comparison("cocondenser/r1", "mlm/r1")
    )
    assert a.endswith("(3 seeds)") and " ± " in b and delta == pytest.approx(0.1, abs=0.01)
    a, b, *_ = claims_table.comparison(
        table, "scifact", claims_table.Comparison("cocondenser/r1", "condenser/r1")
    )
    assert " ± " in a and " ± " not in b and float(b) > 0
