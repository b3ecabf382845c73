"""Checkpoints and resume of a training stage, and the identity that decides whether to resume.

A checkpoint holds the model, the optimizer, the schedule, the step and the torch random state
(dropout), written every ``checkpoint_every`` steps to a folder that Snakemake does not manage (so
it survives a failed job). A rerun resumes from one only when it was made with the same
*identity*: the arguments, the SHA-256 of every input file or folder (:mod:`dprflow.provenance`)
and the code that trains (:func:`dprflow.training.store.code_record`); on the CPU it then ends
with the same weights as a run that was never interrupted. A checkpoint made with other arguments,
from other data or by other code is ignored, and the log names what differs (docs/resuming.md).

A checkpoint is read with ``torch.load(weights_only=True)``: tensors and plain containers only,
so a results folder from elsewhere cannot run code on resume. A checkpoint that holds anything
else is refused with an error. A write that runs out of disk space is reported as such and leaves
no folder that looks finished (:func:`dprflow.files.disk_full_error`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dprflow.files import disk_full_error
from dprflow.training.store import CODE_FILE, IDENTITY_FILE, code_changes, code_record, read_code

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "step-"


def fingerprint(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    if not ckpt_dir.is_dir():
        return None
    done = [p for p in ckpt_dir.glob(CHECKPOINT_PREFIX + "*") if (p / "COMPLETE").exists()]
    return max(done, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]), default=None)


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: about what ``torch.save`` writes."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0


def describe_difference(old: Any, new: Any, where: str = "") -> str:
    """The leaves that differ between two JSON-like values, as ``key: old -> new``."""
    if isinstance(old, dict) and isinstance(new, dict):
        parts = [
            describe_difference(old.get(k), new.get(k), f"{where}.{k}" if where else str(k))
            for k in sorted(set(old) | set(new))
        ]
        return "; ".join(p for p in parts if p)
    if old == new:
        return ""
    return f"{where}: {old!r} -> {new!r}"


class Checkpoints:
    """The checkpoints of one run in ``folder``, under the identity ``payload``."""

    def __init__(self, folder: Path, payload: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.payload = payload
        self.identity = fingerprint(payload)

    def path(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is (or would be) kept."""
        return self.folder / f"{CHECKPOINT_PREFIX}{step}"

    def save(
        self, step: int, model: torch.nn.Module, save_fn: Callable, trainer_state: dict[str, Any]
    ) -> Path:
        """Write ``step-<step>`` atomically (model folder, trainer state, identity, code) and
        remove the older ones."""
        final = self.path(step)
        tmp = self.folder / f".tmp-{CHECKPOINT_PREFIX}{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = {"step": step, "identity": self.identity, **trainer_state}
        try:
            save_fn(model, tmp / "model")
            torch.save(state, tmp / "trainer_state.pt")
            (tmp / IDENTITY_FILE).write_text(json.dumps(self.payload, sort_keys=True, default=str))
            (tmp / CODE_FILE).write_text(json.dumps(code_record(), indent=1))
            (tmp / "COMPLETE").write_text(self.identity)
        except Exception as exc:
            full = disk_full_error(exc, tmp / "trainer_state.pt", state_bytes(state))
            shutil.rmtree(tmp, ignore_errors=True)
            if full is None:
                raise
            raise full from exc
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in self.folder.glob(CHECKPOINT_PREFIX + "*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint at step %d: %s", step, final)
        return final

    def latest_resumable(self) -> tuple[Path, dict[str, Any]] | None:
        """The latest checkpoint made with this identity and code, and its trainer state; None
        when there is none (the log says why one was ignored)."""
        ckpt = latest_checkpoint(self.folder)
        if ckpt is None:
            return None
        if (ckpt / "COMPLETE").read_text() != self.identity:
            log.warning(
                "ignoring checkpoint %s: it was made with other arguments or data (%s); training from step 0",
                ckpt,
                self.identity_difference(ckpt),
            )
            return None
        changed = code_changes(read_code(ckpt))
        if changed:
            # Steps of other code followed by steps of this code give a model no clean run gives.
            log.warning(
                "ignoring checkpoint %s: the code that trains changed since it was written (%s); "
                "training from step 0",
                ckpt,
                ", ".join(changed[:8]),
            )
            return None
        try:
            state = torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ValueError(
                f"refusing to resume from {ckpt / 'trainer_state.pt'}: it holds objects other than tensors "
                f"and plain values, which loading would run as code ({str(exc).splitlines()[0]}); "
                f"delete {self.folder} to train from the start"
            ) from None
        return ckpt, state

    def identity_difference(self, folder: Path) -> str:
        """What differs between a checkpoint's (or the store's) identity and this run's, for the log."""
        try:
            old = json.loads((folder / IDENTITY_FILE).read_text())
        except (OSError, ValueError):
            return "the checkpoint records no identity details"
        return describe_difference(old, json.loads(json.dumps(self.payload, default=str))) or "unknown"

    def remove(self, keep: str) -> None:
        """Remove the checkpoints and running logs, all but the entry named ``keep``."""
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            if path.name == keep:
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
