"""An in-process Snakemake call (tests/snakemake_cli.py) leaves the test process as it found it.

Snakemake's scheduler installs a SIGTERM handler that only sets a flag. Left in place, every
process the same test worker forks later inherits it, and ``multiprocessing.Pool.terminate``
(SIGTERM to its workers, then a join) waits for ever on a worker that caught the signal: the
suite's hang at 97%.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from snakemake_cli import ProcessState, run

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def dry_run(tmp_path: Path) -> None:
    args = ["-n", "-s", ROOT / "Snakefile", "--directory", tmp_path,
            "--configfile", ROOT / "tests" / "data" / "tiny_workflow.yaml"]  # fmt: skip
    result = run(args)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def _wait_forever() -> None:
    while True:
        time.sleep(1)


def test_dry_run_restores_signal_handlers_and_logging(tmp_path):
    import snakemake.cli  # noqa: F401  (what importing Snakemake sets up stays: sys.path gains its pip folder)

    before = ProcessState.take()
    dry_run(tmp_path)
    after = ProcessState.take()
    changed = [
        signal.Signals(s).name for s in before.handlers if after.handlers.get(s) is not before.handlers[s]
    ]
    assert changed == []
    assert logging.getLogger().handlers == before.loggers[""][0]
    assert after.folder == before.folder and after.argv == before.argv and after.path == before.path


def test_a_process_forked_after_a_dry_run_dies_on_sigterm(tmp_path):
    """What Pool.terminate relies on; before the fix the child caught SIGTERM and lived on."""
    dry_run(tmp_path)
    child = multiprocessing.get_context("fork").Process(target=_wait_forever, daemon=True)
    child.start()
    try:
        time.sleep(0.5)  # let the child reach its loop
        child.terminate()
        child.join(timeout=120)  # a dying process ends at once; only a caught SIGTERM waits here
        assert child.exitcode == -signal.SIGTERM
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
            child.join()


def _pools(count: int, done: list[int]) -> None:
    for _ in range(count):
        with multiprocessing.get_context("fork").Pool(1) as pool:  # exit: terminate, then join
            assert pool.map(abs, [-1, 2]) == [1, 2]
        done.append(1)


@pytest.mark.slow
def test_fork_pools_after_a_dry_run_terminate(tmp_path):
    """The issue's reproduction: before the fix, one of a few dozen pools never finished its
    exit. The pools run in a thread so that a hang fails here instead of holding the worker."""
    dry_run(tmp_path)
    done: list[int] = []
    thread = threading.Thread(target=_pools, args=(40, done), daemon=True)
    thread.start()
    thread.join(timeout=600)  # 40 pools take seconds; only a hung terminate reaches this
    assert not thread.is_alive() and len(done) == 40
