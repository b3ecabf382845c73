"""The `python` that Snakemake's jobs find on PATH in the suite's workflow runs: a job's
``python -m <module> ...`` is forked from a server that imported torch and transformers once.

Every job of a workflow run is a fresh interpreter that spends 4-5 s of CPU importing torch,
transformers and a BERT model class before a step of its own (a tiny run: 16 such jobs). Here
the runs that execute jobs (tests/snakemake_cli.py) put a folder first on PATH whose ``python``
sends ``-m`` calls to a server of this test process: the server forks, the child takes the
job's working folder, environment, umask and standard streams (passed as file descriptors), and
runs the module as ``python -m`` would (runpy, ``sys.argv``, ``sys.path`` with the job's
PYTHONPATH); the caller forwards the signals it receives, and exits with the child's status or
dies of the child's signal. The job's Snakemake command, shell line and code are the real ones;
only the interpreter's start is shared (as tests/stage_process.py does for the stage tests).

The server runs no tensor operation before it forks (as tests/stage_process.py's). Snakemake sets
each job's thread counts (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, ...: :data:`THREAD_VARIABLES`),
which OpenMP and OpenBLAS read when they are loaded: the server loads them with one thread each
and the child sets the job's counts on every loaded pool (threadpoolctl), as a fresh interpreter
would have read them. A call goes to a real interpreter instead when it is not ``-m``, when the
server is not up yet, or when the job's environment differs from the server's in another
variable that packages read when they are imported (:data:`IMPORT_TIME_PREFIXES`). Runs on the
cluster (tests/test_slurm.py), the stage import checks (tests/test_startup_imports.py) and
`make run` use real interpreters throughout.
``DPRFLOW_TEST_REAL_PYTHON=1`` turns the server off for a test run.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

# The packages a job's module imports: loaded once by the server, before it forks.
PRELOAD = ("numpy", "pandas", "pyarrow.parquet", "torch", "transformers")
PRELOAD_ATTRIBUTES = (
    "BertModel",
    "BertTokenizer",
    "BertTokenizerFast",
    "AutoModel",
    "AutoTokenizer",
    "AutoConfig",
)
# Environment variables that torch, transformers, tokenizers, BLAS or Python read at start-up or
# import: a job whose value differs from the server's runs in a real interpreter. PYTHONPATH is
# the exception: the child builds its sys.path from the job's.
IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TORCH",
    "PYTORCH_",
    "CUDA",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "LD_",
    "XDG_",
    "HOME",
)
# Set by Snakemake for every job (its ``threads``); read by OpenMP and OpenBLAS when loaded.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
SHIM = """#!/bin/sh
# tests/job_server.py: `python -m ...` to the suite's job server, anything else to {real}
if [ "$1" = "-m" ] && [ -S {socket} ]; then
    exec {real} -I -S {client} {socket} "$@"
fi
exec {real} "$@"
"""


def import_time_environment(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that packages read when imported, but PYTHONPATH and the thread
    counts (:data:`THREAD_VARIABLES`), which the child sets itself."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith(IMPORT_TIME_PREFIXES) and k != "PYTHONPATH" and k not in THREAD_VARIABLES
    }


def thread_count(env: dict[str, str]) -> int | None:
    """The size of every OpenMP and BLAS pool a fresh interpreter with ``env`` gets, when ``env``
    gives every count of :data:`THREAD_VARIABLES` as the same positive integer (as Snakemake
    does); else None (which library reads which variable first is theirs to settle)."""
    (count, *others) = {env.get(k, "") for k in THREAD_VARIABLES}
    return int(count) if not others and count.isdigit() and int(count) > 0 else None


def _send(conn: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    conn.sendall(len(data).to_bytes(8, "big") + data)


def _receive(conn: socket.socket, fds: int = 0) -> tuple[dict, list[int]]:
    """A message of :func:`_send` (of the caller's request: with ``fds`` file descriptors)."""
    head, got = socket.recv_fds(conn, 8, fds)[:2] if fds else (conn.recv(8), [])
    head += _exactly(conn, 8 - len(head))
    return json.loads(_exactly(conn, int.from_bytes(head, "big"))), list(got)


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("job server: connection closed")
        data += chunk
    return data


# --- the caller: `python -m ...` as a job runs it ---------------------------------------------


def client(sock: str, argv: list[str]) -> None:
    """Send the call to the server and become its result; a refused call execs the real Python."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock)
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask()}
        data = json.dumps(request).encode()
        socket.send_fds(conn, [len(data).to_bytes(8, "big") + data], [0, 1, 2])
        reply, _ = _receive(conn)
    except (OSError, EOFError):
        reply = {"refused": "the server is not answering"}
    if "refused" in reply:
        conn.close()
        os.execv(sys.executable, [sys.executable, *argv])
    pid = reply["pid"]
    for sig in SIGNALS:
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    try:
        status = _receive(conn)[0]["status"]
    except (OSError, EOFError):  # the server went away first: so does its job
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        print(f"job server: stopped before job {pid} ended; killed it", file=sys.stderr)
        os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- the server ---------------------------------------------------------------------------------


def _child(request: dict, fds: list[int], base_path: list[str], added: dict[str, str]) -> None:
    """In the forked process: take the job's streams, folder, environment and umask, then run the
    module as ``python -m`` does; never returns."""
    code, interrupted = 1, False
    try:
        for target, fd in enumerate(fds):
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)
        for sig in (signal.SIGCHLD, *SIGNALS):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in added.items():
            os.environ.setdefault(key, value)
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *extra, *base_path]
        import threadpoolctl

        threadpoolctl.threadpool_limits(limits=thread_count(request["env"]))  # every pool
        import random
        import tempfile

        import numpy

        random.seed()  # a fresh interpreter's state, not the server's
        numpy.random.seed()
        tempfile.tempdir = None  # found again from the job's TMPDIR
        import runpy
        import types

        sys.argv = request["argv"][1:]  # runpy puts the module's file first, as `python -m`
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            runpy._run_module_as_main(request["argv"][1], alter_argv=True)  # what `python -m` calls
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException as exc:  # the traceback Python prints, without this function's frame
            sys.excepthook(type(exc), exc, exc.__traceback__.tb_next)
            interrupted = isinstance(exc, KeyboardInterrupt)
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream must not change the exit code
                stream.flush()
        if interrupted:  # Python dies of SIGINT after a KeyboardInterrupt's traceback
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def serve(sock: str) -> None:
    """Preload, then answer calls until this process's standard input closes (its test process
    ended): fork a child per call, send its pid and, when it ends, its wait status; a caller that
    goes away takes its child with it (SIGKILL)."""
    import importlib

    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    import threadpoolctl  # noqa: F401 (the child's)
    import transformers

    for name in PRELOAD_ATTRIBUTES:
        getattr(transformers, name)
    environment = import_time_environment(before)
    # What the imports set themselves (torch: KMP_DUPLICATE_LIB_OK, TORCHINDUCTOR_CACHE_DIR), as
    # they would in the job's own interpreter.
    added = {k: v for k, v in os.environ.items() if k not in before}
    script_dir = str(Path(__file__).resolve().parent)
    server_extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path if p not in (script_dir, "", *server_extra)]

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock + ".new")
    listener.listen(64)
    os.rename(sock + ".new", sock)  # callers see the socket once it accepts
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    jobs: dict[int, socket.socket] = {}
    callers: dict[socket.socket, int] = {}
    while True:
        readable, _, _ = select.select([sys.stdin, listener, wake_r, *callers], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            break
        if listener in readable:
            conn, _ = listener.accept()
            try:
                request, fds = _receive(conn, fds=3)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            why, theirs = None, import_time_environment(request["env"])
            if request["argv"][:1] != ["-m"] or len(request["argv"]) < 2:
                why = "not a -m call"
            elif theirs != environment:
                keys = sorted(k for k in {*theirs, *environment} if theirs.get(k) != environment.get(k))
                why = f"the import-time variables {', '.join(keys)} differ"
            elif thread_count(request["env"]) is None:
                why = "the thread counts are not one positive integer"
            if why:
                for fd in fds:
                    os.close(fd)
                print(f"refused {request['argv'][:2]}: {why}", file=sys.stderr, flush=True)
                _send(conn, {"refused": why})
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                os.close(wake_r)
                os.close(wake_w)
                for other in callers:
                    other.close()
                _child(request, fds, base_path, added)
            for fd in fds:
                os.close(fd)
            _send(conn, {"pid": pid})
            jobs[pid], callers[conn] = conn, pid
        if wake_r in readable:  # drain the signal bytes; the reaping below is for any SIGCHLD
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        for conn in [c for c in callers if c in readable]:
            if not conn.recv(1, socket.MSG_PEEK):  # the caller is gone: so is its job
                with contextlib.suppress(ProcessLookupError):
                    os.kill(callers[conn], signal.SIGKILL)
        while jobs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = jobs.pop(pid, None)
            if conn is not None:
                callers.pop(conn, None)
                try:
                    _send(conn, {"status": status})
                except OSError:
                    pass
                conn.close()


# --- the test process's side --------------------------------------------------------------------

# One server per environment the suite's runs start from (its import-time variables): tests
# change this process's environment, and a server serves only jobs of its own.
_servers: dict[str, tuple[subprocess.Popen, Path]] = {}


def job_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the folder of its server's shim first on PATH, the
    server started on first use and waited for; unchanged with ``DPRFLOW_TEST_REAL_PYTHON=1``.
    Until the server answers, jobs go to real interpreters, whose imports of torch and
    transformers compete with the server's own (on 2 cores the tiny run's first three jobs took
    22 s that way, about 4 s served)."""
    env = dict(os.environ if env is None else env)
    if os.environ.get("DPRFLOW_TEST_REAL_PYTHON") == "1":
        return env
    _, folder = _server(env)
    wait_until_serving(env)
    env["PATH"] = f"{folder}{os.pathsep}{env.get('PATH', '')}"
    return env


def wait_until_serving(env: dict[str, str]) -> Path | None:
    """Wait (no time limit) until the server for ``env`` answers calls: its folder (``server.log``
    there lists the calls it refused), or None when it exited first."""
    import time

    server, folder = _server(env)
    while not (folder / "server.sock").exists():
        if server.poll() is not None:
            return None
        time.sleep(0.1)
    return folder


def _server(env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    key = json.dumps(sorted(import_time_environment(env).items()))
    if key not in _servers:
        folder = Path(tempfile.mkdtemp(prefix="dprflow-jobs-"))
        sock = folder / "server.sock"
        real = Path(sys.executable)
        # Started without waiting: calls made before its socket exists go to real interpreters.
        # Its pools are loaded with one thread each; a child sets its job's counts.
        server = subprocess.Popen(
            [str(real), str(Path(__file__).resolve()), "serve", str(sock)],
            stdin=subprocess.PIPE,
            env={**env, **dict.fromkeys(THREAD_VARIABLES, "1")},
            stdout=subprocess.DEVNULL,
            stderr=open(folder / "server.log", "w"),  # noqa: SIM115 (the server's)
        )
        shim = folder / "python"
        quoted = {"real": real, "socket": sock, "client": Path(__file__).resolve()}
        shim.write_text(SHIM.format(**{k: shlex.quote(str(v)) for k, v in quoted.items()}))
        shim.chmod(0o755)
        if not _servers:
            atexit.register(_stop)
        _servers[key] = (server, folder)
    return _servers[key]


def _stop() -> None:
    for server, folder in _servers.values():
        server.stdin.close()
        server.wait()
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[1], sys.argv[2:])
