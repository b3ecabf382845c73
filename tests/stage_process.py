"""Run a stage in a process of its own, as its rule does, without paying torch's import each time.

A stage's process must be real where a test kills it (``DPRFLOW_KILL_AFTER_STEP``: SIGKILL after a
step) or runs it on edited code. A fresh interpreter costs about 7 s of CPU importing torch and
transformers; here each run is forked from a server process (multiprocessing's ``forkserver``)
that imported them once and never ran a tensor operation, so the fork is safe (no thread pool to
inherit) and costs a fraction of a second. The child is a real process: killed with SIGKILL, it
leaves what a killed job leaves.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import job_server

ROOT = Path(__file__).resolve().parents[1]
# Imported once by the server: the job server's packages (pandas and pyarrow were most of what
# the children still imported, 21 s of the suite's CPU), then the model and the dprflow modules
# most stages import; each stage module imports the rest of what it needs.
PRELOAD = [
    *job_server.PRELOAD,
    "transformers.models.bert.modeling_bert",
    "dprflow.training.trainer",
    "dprflow.finetuning.examples",
    "dprflow.pretraining.documents",
]
_context = None


def forkserver():
    """multiprocessing's forkserver context, its server preloading torch and transformers (also
    for torch.multiprocessing's ``start_processes(..., start_method="forkserver")``)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(stage: str, argv: list[str], env: dict[str, str], out: str, err: str, src: str | None) -> None:
    """The forked process: the stage's ``main(argv)`` with ``env`` set, its output in ``out`` and
    ``err``, from the package under ``src`` when given (edited code: dprflow is imported afresh)."""
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    if src is not None:
        sys.path.insert(0, src)
        for name in [m for m in sys.modules if m == "dprflow" or m.startswith("dprflow.")]:
            del sys.modules[name]
    code = importlib.import_module(f"dprflow.stages.{stage}").main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_stage(
    stage: str, argv: list[str], env: dict[str, str] | None = None, src: str | Path | None = None
) -> subprocess.CompletedProcess:
    """``python -m dprflow.stages.<stage> argv`` in a process forked from the server, with the
    environment ``env`` (default: this one), from the package under ``src`` (default: installed).
    Returns its exit code (``-9`` when killed by SIGKILL), stdout and stderr."""
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        args = (stage, list(argv), env, out, err, None if src is None else str(src))
        process = forkserver().Process(target=_child, args=args)
        process.start()
        process.join()
        return subprocess.CompletedProcess(
            [sys.executable, "-m", f"dprflow.stages.{stage}", *argv],
            process.exitcode,
            Path(out).read_text(),
            Path(err).read_text(),
        )
