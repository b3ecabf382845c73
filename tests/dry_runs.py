"""Snakemake dry runs of the repository's workflow, in the test process
(tests/snakemake_cli.py): a run that must fail, and the jobs a run plans, by rule."""

from __future__ import annotations

import sys
from pathlib import Path

from snakemake_cli import snakemake as run_snakemake

ROOT = Path(__file__).resolve().parents[1]
DRY_RUN = [str(Path(sys.executable).with_name("snakemake")), "-n", "--quiet", "-s", str(ROOT / "Snakefile")]


def failed_dry_run(workdir: Path, override: str) -> str:
    """What a dry run of the default config with ``--config override`` prints; it must fail."""
    cmd = [*DRY_RUN, "--configfile", str(ROOT / "config" / "config.yaml"), "-d", str(workdir)]
    out = run_snakemake([*cmd, "--config", override])
    assert out.returncode != 0
    return out.stdout + out.stderr


def planned_jobs(workdir: Path, configfile: Path, *extra: str) -> dict[str, int]:
    """The jobs `snakemake -n` plans, by rule."""
    cmd = [*DRY_RUN, "--configfile", str(configfile), "-d", str(workdir), *extra]
    out = run_snakemake([*cmd[:2], *cmd[3:]])
    assert out.returncode == 0, out.stderr[-3000:]
    if "Nothing to be done" in out.stdout + out.stderr:
        return {}
    stats = (out.stdout + out.stderr).split("Job stats:")[1].split("\n\n")[0].splitlines()[3:]
    return {rule: int(n) for rule, n in (line.split() for line in stats) if rule != "total"}
