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


def all_methods_plan(workdir: Path, overrides: str, *targets: str) -> str:
    """What ``snakemake -n -p --verbose`` prints for every method (config/examples/all-methods.yaml)
    with the YAML ``overrides`` on top: each job's rule and shell command."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "over.yaml").write_text(overrides)
    all_methods = str(ROOT / "config" / "examples" / "all-methods.yaml")
    cmd = [DRY_RUN[0], *targets, "-n", "-p", "--verbose", "-s", str(ROOT / "Snakefile"), "-d", str(workdir)]
    result = run_snakemake([*cmd, "--configfile", all_methods, str(workdir / "over.yaml")], cwd=ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout + result.stderr


def commands_by_rule(plan: str) -> dict[str, list[str]]:
    """Each rule's shell commands in a dry run's output (:func:`all_methods_plan`)."""
    commands: dict[str, list[str]] = {}
    rule = None
    for line in plan.splitlines():
        if line.startswith(("rule ", "localrule ")):
            rule = line.split()[1].rstrip(":")
        elif line.startswith("Shell command: ") and rule:
            commands.setdefault(rule, []).append(line[len("Shell command: ") :])
    return commands


def stage_args(command: str):
    """The stage's parsed argument dataclass for one shell command (parsed, not run)."""
    import importlib
    import shlex

    from dprflow.cli import parse_args

    words = shlex.split(command.split(" > ")[0])
    module = words[words.index("-m") + 1]
    stage = importlib.import_module(module)
    return parse_args(stage.Args, words[words.index("-m") + 2 :], module)
