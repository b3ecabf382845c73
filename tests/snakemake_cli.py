"""Snakemake's command line inside the test process, for the runs that execute no job.

A dry run (``-n``), ``--summary`` or ``--touch`` as a command costs about 3 s of CPU, 2 s of it
importing Snakemake and its plugins; the suite makes dozens. Here ``snakemake.cli.main`` runs in
the test's process with the same arguments: the same parser, DAG and output, about 0.3 s after
the first. The working folder, the environment and the standard streams are restored after each
call (``--directory`` changes the folder). Runs that execute jobs stay commands
(:func:`subprocess.run`), as a user runs them.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

# Arguments that make a call execute no job: it may run in this process.
NO_JOBS = ("-n", "--dry-run", "--dryrun", "--summary", "--detailed-summary", "--touch", "-t")


def executes_no_job(args: Sequence[str]) -> bool:
    return any(arg in NO_JOBS for arg in args)


def run(
    args: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """``snakemake args`` (without the program) in this process, with the environment ``env``
    (default: this one) and working folder ``cwd``; its exit code and output, as a command's."""
    if not executes_no_job(args):
        raise ValueError(f"snakemake {' '.join(args)} executes jobs: run it as a command")
    import snakemake.cli

    out, err = io.StringIO(), io.StringIO()
    folder, environment = os.getcwd(), dict(os.environ)
    code = 0
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                snakemake.cli.main(list(map(str, args)))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(folder)
        os.environ.clear()
        os.environ.update(environment)
    return subprocess.CompletedProcess(["snakemake", *map(str, args)], code, out.getvalue(), err.getvalue())


def snakemake(
    command: Sequence[str | Path], env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """A Snakemake command line (``[<path to snakemake>, *args]``): in this process when it
    executes no job, else as a command (output captured, no timeout a slow machine reaches)."""
    args = [str(a) for a in command[1:]]
    if executes_no_job(args):
        return run(args, env, cwd)
    return subprocess.run(
        [str(command[0]), *args], capture_output=True, text=True, timeout=3600, env=env, cwd=cwd
    )
