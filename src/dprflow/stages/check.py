"""Stage ``check``: compare the latest comparison table with a file of expected metrics.

As pyserini's reproduction tables do for released models, here for this workflow's own training
outputs: each expected row (collection, system, metric, value, tolerance) is looked up in
``results/compare.csv`` and printed as OK or FAIL; any FAIL, or an expected row that is missing
from the results, fails the stage (non-zero exit, no output written). ``--update`` writes the
expected file from the current table instead (after a run whose numbers are meant to change).

The expected file (YAML)::

    tolerance: 0.005          # default absolute tolerance
    rows:
      - {collection: stdlib, system: bm25, metric: RR@10, value: 0.3638, tolerance: 1.0e-4}
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

import pandas as pd
import yaml

from dprflow.cli import run_stage
from dprflow.errors import StageError
from dprflow.files import atomic_path

log = logging.getLogger("dprflow.check")

KEYS = ("collection", "system", "metric")


@dataclass
class Args:
    """Check the comparison table against expected metrics."""

    compare_csv: str = field(metadata={"help": "results/compare.csv"})
    expected: str = field(metadata={"help": "YAML file of expected metrics"})
    out: str | None = field(default=None, metadata={"help": "report to write when every row is OK"})
    update: bool = field(default=False, metadata={"help": "rewrite the expected file from the table"})
    tolerance: float = field(default=0.005, metadata={"help": "default tolerance of --update"})


def read_expected(path: str) -> tuple[float, pd.DataFrame]:
    try:
        data = yaml.safe_load(open(path)) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise StageError(f"{path}: cannot read the expected metrics ({exc})") from exc
    default = float(data.get("tolerance", 0.005))
    rows = data.get("rows") or []
    for i, row in enumerate(rows, start=1):
        missing = [k for k in (*KEYS, "value") if k not in row]
        if missing:
            raise StageError(f"{path}: row {i} lacks {missing}")
    frame = pd.DataFrame(rows, columns=[*KEYS, "value", "tolerance"])
    frame["tolerance"] = frame["tolerance"].fillna(default).astype(float)
    return default, frame


def check_table(table: pd.DataFrame, expected: pd.DataFrame) -> pd.DataFrame:
    """Expected rows with ``actual``, ``diff`` and ``status`` (OK, FAIL or MISSING)."""
    actual = table.set_index(list(KEYS))["value"]
    out = expected.copy()
    out["actual"] = [actual.get(tuple(k), float("nan")) for k in expected[list(KEYS)].itertuples(index=False)]
    out["diff"] = out["actual"] - out["value"]
    ok = out["diff"].abs() <= out["tolerance"] + 1e-12
    out["status"] = [
        "MISSING" if pd.isna(a) else "OK" if o else "FAIL" for a, o in zip(out["actual"], ok, strict=True)
    ]
    return out


def check(args: Args) -> None:
    table = pd.read_csv(args.compare_csv)
    if args.update:
        rows = [
            {"collection": c, "system": s, "metric": m, "value": round(float(v), 6)}
            for c, s, m, v in table[[*KEYS, "value"]].itertuples(index=False)
        ]
        with atomic_path(args.expected) as tmp:
            tmp.write_text(
                "# Expected metrics for `make check` (stage check); regenerate with --update after a\n"
                "# change that is meant to move the numbers.\n"
                + yaml.safe_dump({"tolerance": args.tolerance, "rows": rows}, sort_keys=False)
            )
        log.info("wrote %d expected rows to %s", len(rows), args.expected)
        return
    _, expected = read_expected(args.expected)
    result = check_table(table, expected)
    lines = [
        f"{r.status:7} {r.collection} {r.system} {r.metric}: expected {r.value:.4f} ± {r.tolerance:g}, got {r.actual:.4f}"
        for r in result.itertuples(index=False)
    ]
    print("\n".join(lines))
    bad = result[result["status"] != "OK"]
    if len(bad):
        raise StageError(
            f"{len(bad)} of {len(result)} expected metrics are outside their tolerance or missing"
        )
    if args.out:
        with atomic_path(args.out) as tmp:
            tmp.write_text("\n".join(lines) + "\n")
    log.info("all %d expected metrics within tolerance", len(result))


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, check, argv, "check")


if __name__ == "__main__":
    sys.exit(main())
