"""TensorBoard event files of a training stage, beside its ``train_log.csv``.

Each optimizer step writes its scalars (the loss and its terms, the learning rate, the gradient
norm before clipping, throughput in tokens/s) under ``<folder>/tensorboard/``; the final model
folder keeps a copy, so ``tensorboard --logdir results/`` shows every stage of a run.

``train_log.csv`` is written by :func:`write_log`; :class:`StepLog` reads the values of the steps
back from the device every ``log_every`` steps instead of after each step.

TensorBoard is optional (``pip install 'dprflow[tracking]'``): without the package no event file
is written and the stage says so once in its log; ``train_log.csv`` is written either way.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EVENTS_DIR = "tensorboard"
_told = False


def summary_writer_class():
    """``torch.utils.tensorboard.SummaryWriter``, or ``None`` when the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch.utils.tensorboard needs the tensorboard package
        return None
    return SummaryWriter


class EventLog:
    """Scalars per step into TensorBoard event files in ``folder / "tensorboard"`` (main process only).

    ``start`` is the step a resumed run continues from: events a killed run wrote after its last
    checkpoint are purged, so the curves hold each step once.
    """

    def __init__(self, folder: str | Path, enabled: bool = True, start: int = 0) -> None:
        global _told
        self.dir = Path(folder) / EVENTS_DIR
        self.writer = None
        if not enabled:
            return
        writer_class = summary_writer_class()
        if writer_class is None:
            if not _told:
                _told = True
                log.info(
                    "no TensorBoard event files: the tensorboard package is not installed "
                    "(pip install 'dprflow[tracking]'); the losses are in train_log.csv"
                )
            return
        self.writer = writer_class(log_dir=str(self.dir), purge_step=start + 1 if start else None)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


def write_log(history: list[dict], path: Path) -> None:
    """``train_log.csv``: one row per optimizer step, written atomically (a full disk is reported
    with the path and the bytes free, and leaves no partial file)."""
    from dprflow.files import disk_full_error

    if not history:
        return
    keys = list(dict.fromkeys(k for row in history for k in row))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            writer.writerows(history)
    except OSError as exc:
        full = disk_full_error(exc, tmp)
        tmp.unlink(missing_ok=True)
        if full is None:
            raise
        raise full from exc
    os.replace(tmp, path)


class StepLog:
    """The logged values of each step, read back from the device every ``every`` steps.

    ``float(loss)`` after every step makes the host wait for the GPU to finish that step, so the
    next batch cannot be queued meanwhile. The steps' values stay on the device as tensors and are
    read in one copy per ``every`` steps (:meth:`flush`), which also checks that every loss is
    finite; the rows, the CSV and the TensorBoard curves are the same for any ``every``. The
    trainer flushes before each checkpoint, so a checkpoint never follows an unchecked loss.
    """

    def __init__(self, history: list[dict], events: EventLog, every: int) -> None:
        if every < 1:
            raise ValueError(f"log_every must be >= 1, got {every}")
        self.history = history
        self.events = events
        self.every = every
        self.pending: list[tuple[int, float, list[str], Any, int, float]] = []

    def add(self, step: int, lr: float, values: Mapping[str, Any], tokens: int, seconds: float) -> list[dict]:
        """Queue step ``step``'s values (tensors on any device); returns the rows flushed, if any."""
        import torch

        names = list(values)
        stacked = torch.stack([torch.as_tensor(values[k]).detach().float().reshape(()) for k in names])
        self.pending.append((step, lr, names, stacked, tokens, seconds))
        return self.flush() if len(self.pending) >= self.every else []

    def flush(self) -> list[dict]:
        """Read the queued values (one device-to-host copy), check the losses, append the rows."""
        import torch

        if not self.pending:
            return []
        values = torch.stack(
            [p[3].cpu() if p[3].device.type != "cpu" else p[3] for p in self.pending]
        ).tolist()
        rows = []
        for (step, lr, names, _, tokens, seconds), read in zip(self.pending, values, strict=True):
            row = {"step": step, "lr": lr, **dict(zip(names, read, strict=True))}
            if not math.isfinite(row["loss"]):
                self.pending.clear()
                raise FloatingPointError(f"loss is {row['loss']} at step {step}")
            rows.append(row)
            self.history.append(row)
            tracked = {f"train/{k}": v for k, v in row.items() if k != "step"}
            self.events.scalars(step, {**tracked, "train/tokens_per_s": tokens / max(seconds, 1e-9)})
        self.pending.clear()
        return rows
