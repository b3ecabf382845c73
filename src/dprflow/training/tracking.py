"""TensorBoard event files of a training stage, beside its ``train_log.csv``.

Each optimizer step writes its scalars (the loss and its terms, the learning rate, the gradient
norm before clipping, throughput in tokens/s) under ``<folder>/tensorboard/``; the final model
folder keeps a copy, so ``tensorboard --logdir results/`` shows every stage of a run.

TensorBoard is optional (``pip install 'dprflow[tracking]'``): without the package no event file
is written and the stage says so once in its log; ``train_log.csv`` is written either way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

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
