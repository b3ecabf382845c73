"""Print the latest benchmark figures (results/bench/*.json) as a Markdown table, and write it to
bench/RESULTS.md (the snapshot the README links to)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from _common import bench_dir, machine


def main() -> None:
    rows = [
        "| benchmark | value | unit | baseline | ratio | target | device |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted(bench_dir().glob("*.json")):
        r = json.loads(path.read_text())
        fmt = lambda v: f"{v:.4g}" if isinstance(v, int | float) else ("" if v is None else str(v))  # noqa: E731
        rows.append(
            f"| {r['name']} | {fmt(r['value'])} | {r['unit']} | {fmt(r.get('baseline'))} | "
            f"{fmt(r.get('ratio'))} | {fmt(r.get('target'))} | {r.get('device') or 'this machine'} |"
        )
    table = "\n".join(rows)
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
