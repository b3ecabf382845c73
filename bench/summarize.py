"""Print the latest benchmark figures (results/bench/*.json) as a Markdown table, and write it to
bench/RESULTS.md (the snapshot the README links to)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from _common import bench_dir, machine


def fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, int | float) else ("" if v is None else str(v))


def load_text(record: dict) -> str:
    load = record.get("load_average") or {}
    return ", ".join(f"{'/'.join(map(str, v))} {k.replace('_', ' ')}" for k, v in load.items()) or "?"


def startup_table(records: list[dict]) -> str:
    """bench_startup.py's figures, one row per stage (they would crowd the main table)."""
    numpy = next((r for r in records if r["name"] == "startup_numpy"), None)
    stages = [r for r in records if r["name"] != "startup_numpy"]
    if not stages:
        return ""
    rows = [
        "\n## Start-up per stage (bench/bench_startup.py)\n",
        "`python -m dprflow.stages.<stage> --help` in a fresh process, best of "
        f'{stages[0].get("n", "?")} (median beside it); `python -c "import numpy"` in the same run: '
        f"{fmt(numpy['value']) if numpy else '?'} s; load average (1, 5, 15 min) {load_text(stages[0])}. "
        "`before`: the checkout given to --compare-src.\n",
        "| stage | s | median | before | median before | imports torch | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in stages:
        rows.append(
            f"| {r['name'].removeprefix('startup_')} | {fmt(r['value'])} | {fmt(r.get('median'))} | "
            f"{fmt(r.get('before'))} | {fmt(r.get('before_median'))} | "
            f"{'yes' if r.get('imports_torch') else 'no'} | {fmt(r.get('target'))} |"
        )
    return "\n".join(rows)


def main() -> None:
    rows = [
        "| benchmark | value | unit | baseline | ratio | target | device |",
        "|---|---|---|---|---|---|---|",
    ]
    startup = []
    for path in sorted(bench_dir().glob("*.json")):
        r = json.loads(path.read_text())
        if r["name"].startswith("startup_"):
            startup.append(r)
            continue
        rows.append(
            f"| {r['name']} | {fmt(r['value'])} | {r['unit']} | {fmt(r.get('baseline'))} | "
            f"{fmt(r.get('ratio'))} | {fmt(r.get('target'))} | {r.get('device') or 'this machine'} |"
        )
    table = "\n".join(rows) + ("\n" + startup_table(startup) if startup else "")
    print(table)
    header = (
        "# Latest benchmark figures\n\n"
        f"Written by `make bench` (bench/summarize.py) on a machine with {machine()['cores']} cores "
        f"(torch threads {machine()['torch_threads']}); the JSON files behind it are in results/bench/.\n\n"
    )
    if os.environ.get("DPRFLOW_BENCH_SNAPSHOT", "1") == "1":
        (Path(__file__).parent / "RESULTS.md").write_text(header + table + "\n")


if __name__ == "__main__":
    main()
