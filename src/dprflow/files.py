"""Files a stage writes: atomic writes, scratch folders beside an output, disk-full errors.

- :func:`atomic_path`: a temporary path beside the target, renamed onto it only when the block
  succeeds, so a failed stage leaves nothing that looks finished; the file gets the umask's mode
  (:func:`umask_mode`).
- :func:`disk_full_error`: a write that ran out of space as a :class:`DiskFullError`, naming the
  path and the bytes free (and needed, when known); a stage reports it as a one-line error.
- :func:`scratch_dir`: a folder beside a stage's output for what it writes for itself (a token
  store, passage texts), removed on exit.
- :func:`staging_path`, :func:`update_json`, :func:`publish`: a model folder trained into a
  staging folder beside its output, completed there (figures measured after training), then
  renamed onto the output, so that a failure leaves nothing that looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dprflow.errors import StageError


class DiskFullError(StageError):
    """A write ran out of disk space; the message names the path and the bytes free (and needed).
    A stage reports it as a one-line error."""


# What torch's zip writer says when a write came up short (it drops the errno): e.g.
# "[enforce fail at inline_container.cc:595] . unexpected pos 116605568 vs 116605456".
_SHORT_WRITE = ("unexpected pos", "failed writing", "PytorchStreamWriter")
# A short write with less than this free on the device is taken as a full disk.
_NEARLY_FULL = 64 * 2**20


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free on the device holding ``path`` (its nearest existing parent); None if unknown."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def disk_full_error(
    exc: BaseException, path: str | os.PathLike, needed: int | None = None
) -> DiskFullError | None:
    """``exc`` as a :class:`DiskFullError` when it is a write that ran out of space, else None.

    Call it before removing the partial output: the free space is measured then."""
    if isinstance(exc, DiskFullError):
        return exc
    free = free_bytes(path)
    full = (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        "No space left on device" in str(exc)
    )
    if not full and isinstance(exc, RuntimeError) and any(s in str(exc) for s in _SHORT_WRITE):
        full = free is not None and free < max(_NEARLY_FULL, needed or 0)
    if not full:
        return None
    need = f"{needed} bytes needed, " if needed else ""
    where = f"{free} bytes free" if free is not None else "free space unknown"
    return DiskFullError(
        f"no space left on device while writing {path} ({need}{where}); the partial output was "
        "removed: free some space (or move results/ to a larger disk) and rerun",
    )


def umask_mode(directory: bool = False) -> int:
    """The mode a new file (``0o666``) or folder (``0o777``) gets under the process's umask:
    0644 and 0755 under the usual umask 022. ``tempfile`` creates 0600 files and 0700 folders
    whatever the umask, so outputs staged there are given this mode before they are renamed."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.
    The file gets the umask's mode (:func:`umask_mode`), as a file opened in place would.
    Running out of disk space raises :class:`DiskFullError` (no partial file is left)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        try:
            yield tmp
            os.chmod(tmp, umask_mode(tmp.is_dir()))
            os.replace(tmp, path)
        except (OSError, RuntimeError) as exc:
            full = disk_full_error(exc, path)
            if full is None:
                raise
            raise full from exc
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def scratch_dir(out: str | Path) -> Iterator[str]:
    """A folder beside a stage's output for a store it writes itself, removed on exit. It is made
    only when something is written there (a view tokenized by
    :func:`dprflow.pretraining.documents.open_or_tokenize`, CoT-MAE's spans, query-as-context's
    query store, the fine-tuning stages' passage texts): a stage that stops before reading its
    corpus (the memory check) leaves nothing on disk."""
    out = Path(out)
    host = socket.gethostname()
    for stale in out.parent.glob(f".{glob.escape(out.name)}.{glob.escape(host)}.*.tokens"):
        # A folder of a process killed on this host (kill -9 skips the clean-up below); processes
        # on other hosts (ranks of a multi-node job) are not this host's to judge.
        pid = stale.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    path = out.parent / f".{out.name}.{host}.{os.getpid()}.tokens"
    try:
        yield str(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def staging_path(out: str | os.PathLike) -> Path:
    """The folder a stage writes ``out`` into before :func:`publish` (hidden, beside ``out``)."""
    out = Path(out)
    return out.parent / f".{out.name}.staging"


def update_json(path: str | os.PathLike, values: dict, section: str | None = None) -> dict:
    """Add ``values`` to the JSON object in ``path`` (to its ``section`` when given); returns the
    object written."""
    path = Path(path)
    record = json.loads(path.read_text())
    (record.setdefault(section, {}) if section else record).update(values)
    path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    return record


def publish(staging: str | os.PathLike, out: str | os.PathLike) -> None:
    """Put the completed ``staging`` folder in place of ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    Path(staging).rename(out)
