"""The suite's own guard against a hang: under `make test`'s settings (two xdist processes, a file
at a time, pyproject.toml's pytest-timeout options) a test that blocks forever fails, naming itself
and where it waited, and the tests after it still run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HANGS = """
import os


def test_before():
    pass


def test_waits_on_a_pipe_nobody_writes():
    read_end, _write_end = os.pipe()
    os.read(read_end, 1)


def test_after():
    pass
"""


@pytest.mark.slow
def test_a_hanging_test_fails_with_its_stack_and_the_rest_runs(tmp_path):
    (tmp_path / "test_hangs.py").write_text(HANGS)
    (tmp_path / "test_other.py").write_text("def test_other_file():\n    pass\n")
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
        "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder",
        "-o", "timeout=3", str(tmp_path),
    ]  # fmt: skip
    # The limit here is the config's own when pytest-timeout is missing: this run would then hang.
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "FAILED test_hangs.py::test_waits_on_a_pipe_nobody_writes" in out, out[-3000:]
    assert "Timeout (>3.0s) from pytest-timeout" in out
    assert "os.read(read_end, 1)" in out  # where it waited
    assert "1 failed, 3 passed" in out, out[-3000:]  # test_after and the other file ran
    assert "crashed" not in out  # the worker lived on
