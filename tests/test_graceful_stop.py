"""A graceful stop (issue 41, item 3): on SIGTERM or SIGUSR1 a training stage saves a checkpoint
at the next step boundary and exits with its error code, so the rerun resumes from that step
instead of the last ``checkpoint_every`` one (the signal Slurm sends before its kill at a job's
time limit).

The stage test sends a real SIGTERM to a stage running in a process of its own
(:mod:`stage_process`), through the kill/resume tests' fault injection (SIGKILL there).
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import socket
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from stage_process import forkserver, run_stage
from training_helpers import argv as train_argv
from training_helpers import same_weights

from dprflow import provenance
from dprflow.stage_args import TrainArgs
from dprflow.stages import train_retriever
from dprflow.training.trainer import KILL_ENV, STOP_SIGNALS, StoppedBySignal, StopRequest, Trainer

STEPS = 24
SIGNAL_AT = 7  # the step after which the stage receives SIGTERM
NEVER = 10_000  # a checkpoint_every no step reaches: the only checkpoint is the signal's
WAIT_S = 300  # waits only; a slow machine never reaches them


def argv(data: Path, init: Path, out: str) -> list[str]:
    """The retriever stage for STEPS steps with no checkpoint of its own on the way."""
    return train_argv(data, init, out, max_steps=STEPS, checkpoint_every=NEVER)


def test_sigterm_saves_the_step_and_the_rerun_resumes_to_the_same_weights(train_data, tiny_init):
    """The stage in a process of its own (forked from the server that imported torch), sent a real
    SIGTERM after step SIGNAL_AT by the kill/resume tests' fault injection (trainer.KILL_ENV):
    deterministic where a signal from outside would race the run's end on a busy machine."""
    assert train_retriever.main(argv(train_data, tiny_init, "whole")) == 0
    resumed = argv(train_data, tiny_init, "resumed")
    stopped = run_stage("train_retriever", resumed, env={**os.environ, KILL_ENV: f"{SIGNAL_AT}:SIGTERM"})
    assert stopped.returncode == 1, stopped.stderr[-3000:]  # the stage's error code, not -15
    stderr = stopped.stderr
    found = re.search(
        rf"stopped on signal SIGTERM \(15\) at step (\d+) of {STEPS}: checkpoint (\S+) written", stderr
    )
    assert found, stderr[-3000:]
    step = int(found.group(1))
    assert step == SIGNAL_AT + 1 and step % NEVER  # sent after step 7's boundary: stops at the end of 8
    assert "rerun the job to resume from step" in stderr
    ckpt = train_data / "resumed.ckpt"
    assert [p.name for p in ckpt.glob("step-*")] == [f"step-{step}"]
    assert found.group(2) == str(ckpt / f"step-{step}")
    assert (ckpt / f"step-{step}" / "COMPLETE").exists()
    # The error path of the stage: no output, no provenance record.
    assert not (train_data / "resumed").exists()
    assert not provenance.record_path(train_data / "resumed").exists()

    again = run_stage("train_retriever", resumed)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr and f"at step {step} of {STEPS}" in again.stderr
    assert same_weights(train_data / "whole", train_data / "resumed")
    a = pd.read_csv(train_data / "whole" / "train_log.csv")
    b = pd.read_csv(train_data / "resumed" / "train_log.csv")
    assert b["step"].tolist() == list(range(1, STEPS + 1))
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-6)


# -- the helper and the loop, in this process ---------------------------------------------------
def test_stop_request_records_a_signal_and_puts_the_handlers_back():
    def mine(signum, frame):
        raise AssertionError("the previous handler ran inside the stop request")

    before = signal.signal(signal.SIGUSR1, mine)
    term = signal.getsignal(signal.SIGTERM)
    try:
        with StopRequest() as request:
            assert all(signal.getsignal(s) == request._record for s in STOP_SIGNALS)
            assert request.signum == 0
            signal.raise_signal(signal.SIGUSR1)
            assert request.signum == signal.SIGUSR1
            signal.raise_signal(signal.SIGTERM)  # would end pytest with the default handler
            assert request.signum == signal.SIGTERM
        assert signal.getsignal(signal.SIGUSR1) is mine
        assert signal.getsignal(signal.SIGTERM) == term
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_stop_request_outside_the_main_thread_installs_nothing():
    seen = []

    def enter() -> None:
        with StopRequest() as request:
            seen.append((request.previous, signal.getsignal(signal.SIGTERM)))

    term = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=enter)
    thread.start()
    thread.join(WAIT_S)
    assert seen == [({}, term)]


def tiny_trainer(folder: Path, steps: int, signal_at: int, rank: int | None = None) -> Trainer:
    """A linear model trained ``steps`` steps; its step ``signal_at`` (1-based) raises SIGUSR1 in
    this process (on rank ``rank`` only, when given)."""
    calls = []

    def make_batch(rng: np.random.Generator, items: list[int]) -> torch.Tensor:
        return torch.tensor(items, dtype=torch.float32).unsqueeze(1)

    def step_fn(model: torch.nn.Module, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        calls.append(1)
        if len(calls) == signal_at and rank in (None, int(os.environ.get("RANK", "0"))):
            signal.raise_signal(signal.SIGUSR1)
        return {"loss": model(batch).pow(2).mean()}

    args = TrainArgs(batch_size=4, max_steps=steps, checkpoint_every=NEVER, precision="fp32")
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    return Trainer(model, list(range(8)), make_batch, step_fn, lambda m, p: None, args, folder, {})


def test_a_signal_stops_the_loop_after_its_step_with_a_checkpoint(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    before = signal.getsignal(signal.SIGUSR1)
    trainer = tiny_trainer(tmp_path, steps=6, signal_at=3)
    with pytest.raises(StoppedBySignal, match=r"signal SIGUSR1 \(10\) at step 3 of 6") as stopped:
        trainer.train(lambda m, p: None, tmp_path / "log.csv")
    assert (stopped.value.signum, stopped.value.step) == (signal.SIGUSR1, 3)
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-3"]
    assert pd.read_csv(tmp_path / "log.csv")["step"].tolist() == [1, 2, 3]  # flushed before the save
    assert signal.getsignal(signal.SIGUSR1) == before  # put back


def test_a_signal_during_the_last_step_lets_the_run_finish(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    trainer = tiny_trainer(tmp_path, steps=4, signal_at=4)
    history = trainer.train(lambda m, p: None, tmp_path / "log.csv")
    assert [row["step"] for row in history] == [1, 2, 3, 4]
    assert not list(tmp_path.glob("step-*"))


# -- two processes: the one that got the signal and the other stop after the same step ----------
def _stop_worker(rank: int, port: int, folder: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank)
    )
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # gloo on the CPU, whatever the machine holds
    # The group the trainer would start, with a bound on each wait: a rank left alone in a
    # collective (the other stopped a step earlier) fails the test instead of hanging it.
    timeout = datetime.timedelta(seconds=WAIT_S)
    torch.distributed.init_process_group(
        "gloo", init_method="env://", rank=rank, world_size=2, timeout=timeout
    )
    trainer = tiny_trainer(Path(folder), steps=6, signal_at=2, rank=1)
    try:
        trainer.train(lambda m, p: None, Path(folder) / "log.csv")
    except StoppedBySignal as exc:
        Path(folder, f"rank{rank}").write_text(str(exc.step))
    finally:
        torch.distributed.destroy_process_group()


def test_two_processes_stop_after_the_same_step_when_one_gets_the_signal(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    forkserver()  # the server preloads torch before torch.multiprocessing starts it
    mp.start_processes(
        _stop_worker, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="forkserver"
    )
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["2", "2"]
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-2"]
