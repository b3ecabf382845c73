"""Benchmark: `snakemake -n` wall time on the default config (target: under 5 s).

Runs the dry run a few times in a fresh results-free directory and reports the median.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write_bench


def main() -> None:
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    times = []
    with tempfile.TemporaryDirectory() as work:
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run(
                [
                    snakemake,
                    "-n",
                    "--quiet",
                    "-s",
                    str(ROOT / "Snakefile"),
                    "--directory",
                    work,
                    "--configfile",
                    str(ROOT / "config" / "config.yaml"),
                    "--cores",
                    "2",
                ],
                check=True,
                capture_output=True,
            )
            times.append(time.perf_counter() - t0)
    write_bench(
        "snakemake_dry_run",
        statistics.median(times),
        "s",
        n=len(times),
        seconds=sum(times),
        runs=times,
        target=5.0,
    )


if __name__ == "__main__":
    main()
