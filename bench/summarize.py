"""Print the latest benchmark figures (results/bench/*.json) as a Markdown table."""

from __future__ import annotations

import json

from _common import bench_dir


def main() -> None:
    rows = ["| benchmark | value | unit | baseline | ratio | target |", "|---|---|---|---|---|---|"]
    for path in sorted(bench_dir().glob("*.json")):
        r = json.loads(path.read_text())
        fmt = lambda v: f"{v:.4g}" if isinstance(v, int | float) else ("" if v is None else str(v))  # noqa: E731
        rows.append(f"| {r['name']} | {fmt(r['value'])} | {r['unit']} | {fmt(r.get('baseline'))} | "
                    f"{fmt(r.get('ratio'))} | {fmt(r.get('target'))} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
