"""Progress lines with rate and ETA for the long loops (training, encoding, search, generation,
counting, reranking): one log line every ``every_s`` seconds and at the end, never a terminal bar.

Job logs are files: Hugging Face's own tqdm bars are turned off in every stage
(:func:`quiet_hugging_face`), and these lines say where a loop is, how fast it goes and when it
should end.
"""

from __future__ import annotations

import logging
import os
import sys
import time


def format_seconds(seconds: float) -> str:
    """``1:02:03`` for 3723 s; ``?`` when unknown."""
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """Log ``what done/total (rate unit/s, elapsed, ETA h:mm:ss)`` at most every ``every_s`` seconds.

    Example::

        progress = Progress(log, "encoded", len(texts), unit="texts")
        for batch in batches:
            ...
            progress.update(len(batch))
    """

    def __init__(
        self, logger: logging.Logger, what: str, total: int, unit: str = "items", every_s: float = 30.0
    ) -> None:
        self.logger, self.what, self.total, self.unit, self.every_s = logger, what, total, unit, every_s
        self.done = 0
        self.started = self.last = time.perf_counter()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started
        rate = self.done / elapsed if elapsed > 0 else float("nan")
        eta = (self.total - self.done) / rate if rate and rate == rate else float("nan")
        return (
            f"{self.what} {self.done}/{self.total} {self.unit} ({rate:.1f} {self.unit}/s, "
            f"elapsed {format_seconds(elapsed)}, ETA {format_seconds(eta)})"
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.done >= self.total or now - self.last >= self.every_s:
            self.last = now
            self.logger.info(self.line())


def quiet_hugging_face() -> None:
    """Turn off Hugging Face's progress bars (downloads, checkpoint loading) in job logs."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
