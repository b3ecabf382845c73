"""Snakemake's command line inside the test process, for the runs that execute no job.

A dry run (``-n``), ``--summary`` or ``--touch`` as a command costs about 3 s of CPU, 2 s of it
importing Snakemake and its plugins; the suite makes dozens. Here ``snakemake.cli.main`` runs in
the test's process with the same arguments: the same parser, DAG and output, about 0.3 s after
the first. The process-wide state a call changes is restored after it (:class:`ProcessState`):
the working folder (``--directory``), the environment, the standard streams, the signal handlers
and the logging set-up. The signal handlers matter most: Snakemake's scheduler catches SIGTERM
(to stop its jobs gracefully), and a process forked later by the same test worker inherits the
handler, so ``multiprocessing.Pool.terminate`` (SIGTERM to its workers, then a join) waited for
ever on a worker that had caught the signal and gone back to its queue. Runs that execute jobs
stay commands (:func:`subprocess.run`), as a user runs them; their jobs' ``python -m`` calls
are forked from a server that imported torch once (tests/job_server.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# Arguments that make a call execute no job: it may run in this process.
NO_JOBS = ("-n", "--dry-run", "--dryrun", "--summary", "--detailed-summary", "--touch", "-t")


def executes_no_job(args: Sequence[str]) -> bool:
    return any(arg in NO_JOBS for arg in args)


def _handlers() -> dict[int, object]:
    """Every signal's handler that Python can read (SIGKILL and SIGSTOP have none)."""
    out = {}
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            out[sig] = signal.getsignal(sig)
    return out


@dataclasses.dataclass
class ProcessState:
    """What an in-process Snakemake call may change for the rest of the test process."""

    folder: str
    environment: dict[str, str]
    handlers: dict[int, object]
    loggers: dict[str, tuple[list[logging.Handler], int, bool]]
    argv: list[str]
    path: list[str]

    @classmethod
    def take(cls) -> ProcessState:
        names = ["", *logging.root.manager.loggerDict]
        loggers = {}
        for name in names:
            logger = logging.getLogger(name)
            loggers[name] = (list(logger.handlers), logger.level, logger.propagate)
        return cls(os.getcwd(), dict(os.environ), _handlers(), loggers, list(sys.argv), list(sys.path))

    def restore(self) -> None:
        os.chdir(self.folder)
        os.environ.clear()
        os.environ.update(self.environment)
        for sig, handler in self.handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                with contextlib.suppress(OSError, ValueError, RuntimeError):
                    signal.signal(sig, handler)
        for name in ["", *logging.root.manager.loggerDict]:
            logger = logging.getLogger(name)
            handlers, level, propagate = self.loggers.get(name, ([], logging.NOTSET, True))
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
        sys.argv[:] = self.argv
        sys.path[:] = self.path


def run(
    args: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """``snakemake args`` (without the program) in this process, with the environment ``env``
    (default: this one) and working folder ``cwd``; its exit code and output, as a command's."""
    if not executes_no_job(args):
        raise ValueError(f"snakemake {' '.join(args)} executes jobs: run it as a command")
    import snakemake.cli

    out, err = io.StringIO(), io.StringIO()
    state = ProcessState.take()
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
        state.restore()
    return subprocess.CompletedProcess(["snakemake", *map(str, args)], code, out.getvalue(), err.getvalue())


def snakemake(
    command: Sequence[str | Path], env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """A Snakemake command line (``[<path to snakemake>, *args]``): in this process when it
    executes no job, else as a command (output captured, no timeout a slow machine reaches)."""
    args = [str(a) for a in command[1:]]
    if executes_no_job(args):
        return run(args, env, cwd)
    from job_server import job_environment

    return subprocess.run(
        [str(command[0]), *args],
        capture_output=True,
        text=True,
        timeout=3600,
        env=job_environment(env),
        cwd=cwd,
    )
