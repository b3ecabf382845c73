"""The finished-model store: a stage's final model, kept so that a rerun of the same job does not train again.

Snakemake reruns a training job whose inputs were rewritten even when their content is the same
(after ``finetune.encode_shards`` changed, say). Once a stage has succeeded, its checkpoint folder
keeps ``finished/``: a copy of the final model folder and what it was trained from. A rerun puts it
back instead of training only when all three still hold (issue 22):

* the *identity* is the same: the arguments and the SHA-256 of every input file or folder
  (:mod:`dprflow.provenance`), as for a checkpoint;
* the *code* is the same: every ``dprflow`` source file the stage had imported when it finished
  (by SHA-256) and the torch and transformers versions (:func:`code_record`), so a change to the
  code that trains retrains;
* the *bytes* are the same: every stored file's SHA-256 is checked against the list written when
  the model was kept (``files.json``), so a file replaced inside the store is never handed back;
  and that list is checked against its own SHA-256, written into the ``COMPLETE`` marker with the
  identity, so a store whose files and ``files.json`` were both replaced (another stage's model
  copied in) is not handed back either.

The store never shares a file with the output folder: files are copied (a reflink, which costs no
space, where the file system supports one), so an edit of the output in place cannot reach the
store. TensorBoard event files are packed into one archive (``tensorboard.tar``), so that
``tensorboard --logdir results/`` shows each run once, from the output folder.

Its files get the umask's mode (safetensors writes 0600), which the copies keep.

The store is also the first place the final weights are written: the output folder is copied
from it, so a disk that fills while the output is written leaves the trained model in the store,
and the rerun after space is freed puts it back instead of training again. docs/resuming.md says
why a store, rather than outputs that stay byte-identical across ``encode_shards``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from dprflow import provenance
from dprflow.files import disk_full_error, umask_mode
from dprflow.training.tracking import EVENTS_DIR

log = logging.getLogger(__name__)

FINISHED_DIR = "finished"  # in the checkpoint folder
IDENTITY_FILE = "identity.json"  # the identity's parts (arguments, input hashes), for the log
CODE_FILE = "code.json"  # :func:`code_record` when the model was kept
FILES_FILE = "files.json"  # SHA-256 of every stored file, relative to the store
EVENTS_ARCHIVE = "tensorboard.tar"
CODE_PACKAGES = ("torch", "transformers")
FICLONE = 0x40049409  # Linux ioctl: share the source's extents (btrfs, XFS, bcachefs)


def code_record() -> dict[str, Any]:
    """The code that trains: the SHA-256 of every ``dprflow`` source file this process has
    imported (relative to the package), and the versions of the packages that compute the steps.
    Taken when a model or checkpoint is written, so modules imported during training count.
    Files are found by path, not by module name: a stage run as ``python -m dprflow.stages.X``
    is the module ``__main__``, and its own file is the training code too. Only ``__main__`` and
    paths that start with the package's folder (as imported, or resolved) are resolved: resolving
    all of a training process's 3,000 modules took 0.23 s a checkpoint. (The filter was a
    ``dprflow`` folder anywhere in the path, which every module of a clone named ``dprflow``, the
    name ``git clone`` gives, has: its .venv's torch and transformers were resolved each time.)"""
    imported = Path(sys.modules["dprflow"].__file__).parent
    root = imported.resolve()
    prefixes = tuple({f"{imported}{os.sep}", f"{root}{os.sep}"})
    files = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and (path.startswith(prefixes) or name == "__main__"):
            path = Path(path).resolve()
            if path.is_relative_to(root) and path.is_file():
                files[str(path.relative_to(root))] = provenance.sha256_of(path)
    packages = {name: _version(name) for name in CODE_PACKAGES}
    return {"files": dict(sorted(files.items())), "packages": packages}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def code_changes(recorded: dict[str, Any]) -> list[str]:
    """What changed since ``recorded`` (:func:`code_record`): source files whose content differs or
    that are gone, and package versions; empty when the code is the same. A new import needs an
    edit of an imported file, so comparing the recorded files is enough."""
    root = Path(sys.modules["dprflow"].__file__).resolve().parent
    changed = []
    for rel, digest in recorded.get("files", {}).items():
        path = root / rel
        if not path.is_file():
            changed.append(f"{rel} (removed)")
        elif provenance.sha256_of(path) != digest:
            changed.append(rel)
    for name, version in recorded.get("packages", {}).items():
        if _version(name) != version:
            changed.append(f"{name} {version} -> {_version(name)}")
    if not recorded.get("files"):
        changed.append("no record of the code")
    return changed


def read_code(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / CODE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def read_marker(folder: Path) -> dict[str, str]:
    """The ``COMPLETE`` marker of a store: its identity and the SHA-256 of its ``files.json``
    (empty when missing or unreadable; a store kept before the marker held both reads as other
    arguments, and is trained again once)."""
    try:
        marker = json.loads((folder / "COMPLETE").read_text())
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def clone_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy ``src`` to ``dst`` as a reflink where the file system supports one (no space used, and
    a later write to either file does not reach the other), else byte for byte. Never a hard link."""
    try:
        import fcntl

        with open(src, "rb") as source, open(dst, "wb") as target:
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
        shutil.copystat(src, dst)
    except (OSError, ImportError):
        shutil.copy2(src, dst)


def give_umask_modes(folder: Path) -> None:
    """Give every file below ``folder`` the mode a new file gets under the umask (0644 under 022),
    as every other output has: safetensors writes its files 0600 whatever the umask, and copies
    keep the mode, so a model's weights in the store, ``model/`` and ``hub/`` could not be read by
    the group the rest of the results are shared with."""
    mode = umask_mode()
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def file_hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every file below ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): provenance.sha256_of(p) for p in sorted(folder.rglob("*")) if p.is_file()
    }


class FinishedStore:
    """``<checkpoint_dir>/finished``: the final model of a training stage and what made it."""

    def __init__(self, folder: Path, identity: str, payload: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.identity = identity  # the fingerprint of ``payload``
        self.payload = payload

    def exists(self) -> bool:
        return (self.folder / "COMPLETE").is_file()

    def why_not(self, describe: Callable[[Path], str]) -> str | None:
        """Why the stored model must not be reused (None: it may). ``describe(folder)`` says how
        an identity differs (:meth:`Checkpoints.identity_difference`)."""
        marker = read_marker(self.folder)
        if marker.get("identity") != self.identity:
            return f"it was made with other arguments or data ({describe(self.folder)})"
        changed = code_changes(read_code(self.folder))
        if changed:
            return f"the code that trains changed since it was kept: {', '.join(changed[:8])}"
        try:
            text = (self.folder / FILES_FILE).read_text()
            recorded = json.loads(text)
        except (OSError, ValueError):
            return f"{self.folder / FILES_FILE} is missing or unreadable"
        if marker.get("files_sha256") != hashlib.sha256(text.encode()).hexdigest():
            return f"{self.folder / FILES_FILE} is not the list of files this store was completed with"
        stored = {f"model/{k}": v for k, v in file_hashes(self.folder / "model").items()}
        if (self.folder / EVENTS_ARCHIVE).is_file():
            stored[EVENTS_ARCHIVE] = provenance.sha256_of(self.folder / EVENTS_ARCHIVE)
        differ = sorted(k for k in set(recorded) | set(stored) if recorded.get(k) != stored.get(k))
        if differ:
            return f"its files changed since it was kept: {', '.join(differ[:8])}"
        return None

    def keep(self, write_model: Callable[[Path], None], events: Path | None, needed: int) -> None:
        """Write the final model folder into the store (``write_model(folder)``), pack the event
        files of ``events`` and record the identity, the code and every file's SHA-256. A full
        disk raises :class:`~dprflow.files.DiskFullError` and leaves no partial store."""
        tmp = self.folder.with_name(f".{self.folder.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            write_model(tmp / "model")
            give_umask_modes(tmp / "model")
            hashes = {f"model/{k}": v for k, v in file_hashes(tmp / "model").items()}
            if events is not None and events.is_dir():
                with tarfile.open(tmp / EVENTS_ARCHIVE, "w") as archive:
                    archive.add(events, arcname=EVENTS_DIR)
                hashes[EVENTS_ARCHIVE] = provenance.sha256_of(tmp / EVENTS_ARCHIVE)
            files = json.dumps(hashes, indent=1, sort_keys=True)
            (tmp / FILES_FILE).write_text(files)
            (tmp / CODE_FILE).write_text(json.dumps(code_record(), indent=1))
            (tmp / IDENTITY_FILE).write_text(json.dumps(self.payload, indent=1, default=str))
            marker = {"identity": self.identity, "files_sha256": hashlib.sha256(files.encode()).hexdigest()}
            (tmp / "COMPLETE").write_text(json.dumps(marker))
        except Exception as exc:
            full = disk_full_error(exc, tmp / "model", needed)
            shutil.rmtree(tmp, ignore_errors=True)
            if full is None:
                raise
            raise full from exc
        tmp.rename(self.folder)

    def put_back(self, out: Path, needed: int) -> None:
        """Copy the stored model folder to ``out`` (atomically; event files unpacked). A full disk
        raises :class:`~dprflow.files.DiskFullError` naming the store, which keeps the model."""
        tmp = out.parent / f".{out.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(self.folder / "model", tmp, copy_function=clone_file)
            if (self.folder / EVENTS_ARCHIVE).is_file():
                with tarfile.open(self.folder / EVENTS_ARCHIVE) as archive:
                    archive.extractall(tmp, filter="data")
        except Exception as exc:
            full = disk_full_error(exc, tmp, needed)
            shutil.rmtree(tmp, ignore_errors=True)
            if full is None:
                raise
            raise type(full)(
                f"{full} (the trained model is kept in {self.folder}: the rerun copies it and does not train again)"
            ) from exc
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
