"""The suite's job server (tests/job_server.py): a `python -m` call of a workflow job, served by a
fork of the preloaded server, sees what a fresh interpreter would (arguments, folder, environment,
sys.path, thread counts, temporary folder) and ends as it would (exit code, output, signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import job_server
import pytest

PROBE = """
import json, os, sys, tempfile
import threadpoolctl, torch
# each kind of pool's sizes (the server has loaded more libraries than this module imports)
pools = {api: sorted({p["num_threads"] for p in threadpoolctl.threadpool_info() if p["internal_api"] == api})
         for api in ("openmp", "openblas")}
print(json.dumps({
    "argv": sys.argv[1:], "file": os.path.basename(sys.argv[0]), "cwd": os.getcwd(),
    "path": sys.path, "executable": sys.executable, "x": os.environ.get("X"),
    "torch_threads": torch.get_num_threads(), "pools": pools, "tmp": tempfile.gettempdir(),
    "kmp": os.environ.get("KMP_DUPLICATE_LIB_OK"), "name": __name__,
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The shim's environment (server up), a folder of modules on its PYTHONPATH, the server log."""
    if os.environ.get("DPRFLOW_TEST_REAL_PYTHON") == "1":
        pytest.skip("DPRFLOW_TEST_REAL_PYTHON=1: the server is off")
    modules = tmp_path_factory.mktemp("modules")
    (modules / "probe.py").write_text(PROBE)
    (modules / "sleeper.py").write_text("import sys, time\nprint('up', flush=True)\ntime.sleep(600)\n")
    (modules / "killer.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    venv = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    folder = job_server.wait_until_serving(venv)
    assert folder is not None, "the job server exited"
    env = job_server.job_environment(venv)
    env.update({k: "2" for k in job_server.THREAD_VARIABLES}, PYTHONPATH=str(modules))
    return env, modules, folder / "server.log"


def call(env, line, cwd):
    return subprocess.run(["bash", "-c", line], env=env, cwd=cwd, capture_output=True, text=True)


def refusals(log: Path) -> int:
    return log.read_text().count("refused")


@pytest.mark.slow
def test_a_served_call_sees_and_returns_what_a_fresh_interpreter_does(served, tmp_path):
    env, _, log = served
    real = {**env, "PATH": env["PATH"].split(os.pathsep, 1)[1]}
    for extra in (
        {"X": "a b", "EXIT": "0"},
        {"X": "", "EXIT": "3", "TMPDIR": str(tmp_path), **dict.fromkeys(job_server.THREAD_VARIABLES, "1")},
    ):
        before = refusals(log)
        line = "python -m probe 'one two' three"
        ours = call({**env, **extra}, line, tmp_path)
        theirs = call({**real, **extra}, line, tmp_path)
        assert refusals(log) == before  # served, not handed to a real interpreter
        assert ours.returncode == theirs.returncode == int(extra["EXIT"])
        assert json.loads(ours.stdout) == json.loads(theirs.stdout)
        assert ours.stderr == theirs.stderr == "to stderr\n"
    assert json.loads(ours.stdout)["tmp"] == str(tmp_path) and json.loads(ours.stdout)["torch_threads"] == 1


def test_signals_reach_the_job_and_its_death_reaches_the_caller(served, tmp_path):
    env, _, _ = served
    killed = call(env, "python -m killer; echo $?", tmp_path)
    assert killed.stdout.strip() == "137"
    for sig in (signal.SIGTERM, signal.SIGINT):
        caller = subprocess.Popen(["python", "-m", "sleeper"], env=env, stdout=subprocess.PIPE, text=True)
        assert caller.stdout.readline() == "up\n"
        caller.send_signal(sig)
        code = caller.wait()
        # SIGTERM: the job dies of it, and so does the caller; SIGINT: KeyboardInterrupt, whose
        # traceback Python prints before it dies of SIGINT
        assert code == -sig, code


def test_a_caller_killed_takes_its_job_with_it(served, tmp_path):
    env, modules, _ = served
    (modules / "marker.py").write_text(
        textwrap.dedent(f"""
            import os, time
            open({str(tmp_path / "pid")!r}, "w").write(str(os.getpid()))
            print("up", flush=True)
            time.sleep(600)
        """)
    )
    caller = subprocess.Popen(["python", "-m", "marker"], env=env, stdout=subprocess.PIPE, text=True)
    assert caller.stdout.readline() == "up\n"
    job = int((tmp_path / "pid").read_text())
    assert job != caller.pid
    caller.kill()
    caller.wait()
    while Path(f"/proc/{job}").exists() and "zombie" not in Path(f"/proc/{job}/status").read_text():
        time.sleep(0.1)  # no time limit: the server kills it, or the test hangs and says so


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE differ"),
        ({"OMP_NUM_THREADS": "1"}, "thread counts are not one positive integer"),
    ],
)
def test_a_job_whose_import_time_environment_differs_runs_in_a_real_interpreter(
    served, tmp_path, change, why
):
    env, _, log = served
    before = refusals(log)
    out = call({**env, **change}, "python -m probe", tmp_path)
    assert out.returncode == 0 and json.loads(out.stdout)["argv"] == []
    assert refusals(log) == before + 1
    assert why in log.read_text().splitlines()[-1]
