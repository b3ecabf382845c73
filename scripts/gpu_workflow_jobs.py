"""Every job of a finished workflow run, with its wall time and the device its log names.

    python scripts/gpu_workflow_jobs.py WORKDIR [--out jobs.csv]

Reads the newest Snakemake log in ``WORKDIR/.snakemake/log`` for each job's rule, log and
benchmark file (``s`` in it is the job's wall time; a job not run has none). The device
is the first ``device <d>`` or ``on <d>`` in the log (the trainer, encode_corpus, search_dense,
the reranker's scoring and doc2query each log theirs), or empty for a job that runs no model.
Prints one line per rule (jobs, seconds, devices) and writes the rows as CSV: rule, target,
seconds, device. Made for ``make gpu-workflow``'s check that every model job ran on the GPU
(docs/clusters.md).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

DEVICE = re.compile(r"\b(?:device|on) (cuda(?::\d+)?|cpu|mps)\b")
COLUMNS = ("rule", "target", "seconds", "device")


def job_device(log: Path) -> str:
    """The device a job's log names first, or '' (no log, or a job that loads no model)."""
    if not log.is_file():
        return ""
    for line in log.read_text(errors="replace").splitlines():
        match = DEVICE.search(line)
        if match:
            return match.group(1)
    return ""


RULE = re.compile(r"^(?:local)?rule (\w+):$")


def planned(workdir: Path) -> list[tuple[str, str, str]]:
    """(rule, log, benchmark) of every job in the newest Snakemake log of ``workdir``."""
    logs = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    if not logs:
        return []
    out, rule, fields = [], None, {}
    for line in logs[-1].read_text(errors="replace").splitlines() + [""]:
        match = RULE.match(line)
        if match or not line.startswith("    "):
            if rule and "benchmark" in fields:
                out.append((rule, fields.get("log", ""), fields["benchmark"]))
            rule, fields = (match.group(1) if match else None), {}
        elif rule:
            key, _, value = line.strip().partition(": ")
            fields[key] = value
    return out


def jobs(workdir: Path) -> list[dict[str, str]]:
    """One row per job that Snakemake's newest log lists with a benchmark file."""
    rows = []
    for rule, log, benchmark in planned(workdir):
        tsv = workdir / benchmark
        lines = tsv.read_text().splitlines() if tsv.is_file() else []
        rows.append(
            {
                "rule": rule,
                "target": benchmark.removeprefix("results/benchmarks/").removesuffix(".tsv"),
                "seconds": lines[1].split("\t")[0] if len(lines) > 1 else "",
                "device": job_device(workdir / log) if log else "",
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="CSV of the rows (default: none)")
    args = parser.parse_args(argv)
    rows = jobs(args.workdir)
    if not rows:
        print(f"{args.workdir}/.snakemake/log: no Snakemake log with benchmarked jobs", file=sys.stderr)
        return 1
    by_rule: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        by_rule[row["rule"]].append(row)
    for rule, group in sorted(by_rule.items()):
        seconds = sum(float(r["seconds"] or 0) for r in group)
        devices = ",".join(sorted({r["device"] or "-" for r in group}))
        print(f"{rule:20s} {len(group):3d} jobs {seconds:8.1f} s  device {devices}")
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
