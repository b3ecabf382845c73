"""Every Parquet table that crosses a stage boundary, declared once.

Reading and writing go through :func:`read_table` and :func:`write_table`, which check the
columns and their types against the declaration and name the file and column (or row) when
something is wrong. Writes are atomic: the table goes to a temporary file beside the target and
is renamed into place only when it is complete, so a failed stage leaves nothing that looks
finished (:func:`dprflow.files.atomic_path`). A write that runs out of disk space raises
:class:`dprflow.files.DiskFullError`, naming the path and the bytes free (and needed, when
known), after removing the partial file.

Column names follow ir_measures (``query_id``, ``doc_id``, ``relevance``, ``score``) so that
evaluation needs no conversion. Retrieval happens over *passages*; ``doc_id`` always names a
document of the collection (qrels are judged on documents) and ``passage_id`` a retrieval unit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dprflow.files import atomic_path

STR = pa.string()
I32 = pa.int32()
I64 = pa.int64()
F32 = pa.float32()

SCHEMAS: dict[str, pa.Schema] = {
    # ingest: one row per document of the collection.
    "documents": pa.schema([("doc_id", STR), ("title", STR), ("text", STR)]),
    # ingest: one row per query; split is train, dev, test, or "unjudged" (no qrels anywhere).
    "queries": pa.schema([("query_id", STR), ("text", STR), ("split", STR)]),
    # ingest: graded judgments on documents (relevance > 0 is relevant).
    "qrels": pa.schema([("query_id", STR), ("doc_id", STR), ("relevance", I32)]),
    # split_passages: retrieval units of at most N tokens, with their parent document.
    "passages": pa.schema(
        [
            ("passage_id", STR),
            ("doc_id", STR),
            ("position", I32),
            ("title", STR),
            ("text", STR),
            ("n_tokens", I32),
        ]
    ),
    # any retriever or reranker: ranked passages per query (rank starts at 1).
    "run": pa.schema([("query_id", STR), ("passage_id", STR), ("score", F32), ("rank", I32)]),
    # bm25_negatives / mine_negatives: candidate negatives per training query, positives removed.
    "negatives": pa.schema([("query_id", STR), ("passage_id", STR), ("score", F32), ("rank", I32)]),
    # score_candidates: reranker (teacher) scores of each training query's candidates.
    "scores": pa.schema([("query_id", STR), ("passage_id", STR), ("score", F32)]),
    # nb_recall: nb-recall^n@k of retriever 1 against retriever 2's neighbourhood.
    "nb_recall": pa.schema([("n", I32), ("k", I32), ("value", pa.float64())]),
    # pmi: word n-gram counts, keys are 64-bit hashes; header rows (negative ngram) hold totals.
    "ngram_counts": pa.schema([("n", I32), ("ngram", I64), ("count", I64)]),
    # pmi: per-token importance of each passage (CDMAE importance-aware masking).
    "token_importance": pa.schema([("passage_id", STR), ("importance", pa.list_(F32))]),
    # evaluate: per-query values of every metric (ir_measures names), the aggregate is their mean.
    "metrics": pa.schema([("query_id", STR), ("metric", STR), ("value", pa.float64())]),
    # doc2query: C sampled queries per passage (query_index 0..C-1), query-as-context pre-training.
    "generated_queries": pa.schema([("passage_id", STR), ("query_index", I32), ("text", STR)]),
}


class SchemaError(ValueError):
    """A table does not match its declared schema (the message names the file and column or row)."""


def schema(name: str) -> pa.Schema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise ValueError(f"unknown table schema {name!r}; known: {', '.join(sorted(SCHEMAS))}") from None


def _conform(df: pd.DataFrame, name: str, where: str) -> pa.Table:
    target = schema(name)
    missing = [f.name for f in target if f.name not in df.columns]
    if missing:
        raise SchemaError(f"{where}: table {name!r} lacks column(s) {missing}; has {list(df.columns)}")
    extra = [c for c in df.columns if c not in target.names]
    if extra:
        raise SchemaError(
            f"{where}: table {name!r} has unexpected column(s) {extra}; expected {target.names}"
        )
    arrays = []
    for field in target:
        col = df[field.name]
        if col.isna().any():
            row = int(col.isna().to_numpy().nonzero()[0][0])
            raise SchemaError(f"{where}: column {field.name!r} of {name!r} is null at row {row}")
        try:
            arrays.append(
                pa.array(
                    col.to_numpy() if not pa.types.is_string(field.type) else col.tolist(), type=field.type
                )
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise SchemaError(
                f"{where}: column {field.name!r} of {name!r} cannot be stored as {field.type} ({exc})"
            ) from exc
    return pa.Table.from_arrays(arrays, schema=target)


def write_table(df: pd.DataFrame, path: str | os.PathLike, name: str) -> Path:
    """Check ``df`` against schema ``name`` and write it atomically to ``path`` as Parquet."""
    table = _conform(df.reset_index(drop=True), name, str(path))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return Path(path)


class TableWriter:
    """Write a table piece by piece (a Parquet row group per :meth:`write`), atomically.

    Use it as a context manager: every piece is checked against schema ``name`` like
    :func:`write_table`, and the file appears at ``path`` only when the block ends without an
    error, so a stage can stream its output (by query batch, by document batch) with one batch in
    memory. The rows read back are those of one :func:`write_table` of the concatenated pieces.
    """

    def __init__(self, path: str | os.PathLike, name: str):
        self.path, self.name, self.rows = Path(path), name, 0
        self._atomic = atomic_path(self.path)
        self._writer: pq.ParquetWriter | None = None

    def __enter__(self) -> TableWriter:
        tmp = self._atomic.__enter__()
        self._writer = pq.ParquetWriter(tmp, schema(self.name))
        return self

    def write(self, df: pd.DataFrame) -> None:
        if len(df):
            self._writer.write_table(_conform(df.reset_index(drop=True), self.name, str(self.path)))
            self.rows += len(df)

    def __exit__(self, *exc) -> bool | None:
        self._writer.close()  # an empty table still gets its schema
        return self._atomic.__exit__(*exc)


def _checked_columns(path: Path, name: str, columns: list[str] | None) -> list[str]:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such table (expected a {name!r} table)")
    target = schema(name)
    unknown = [c for c in columns or [] if c not in target.names]
    if unknown:
        raise ValueError(f"table {name!r} has no column(s) {unknown}; its columns: {target.names}")
    try:
        actual = pq.read_schema(path)
    except pa.ArrowException as exc:
        raise SchemaError(f"{path}: not a readable Parquet file ({exc})") from exc
    for field in target:
        if field.name not in actual.names:
            raise SchemaError(f"{path}: table {name!r} lacks column {field.name!r}; has {actual.names}")
        got = actual.field(field.name).type
        if not got.equals(field.type) and not (
            pa.types.is_string(field.type) and pa.types.is_large_string(got)
        ):
            raise SchemaError(f"{path}: column {field.name!r} has type {got}, expected {field.type}")
    return list(columns) if columns else target.names


def read_table(path: str | os.PathLike, name: str, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a Parquet table and check that its columns and types match schema ``name``.

    ``columns`` reads only those (e.g. a passages table without its text), after the same check."""
    path = Path(path)
    names = _checked_columns(path, name, columns)
    return pq.read_table(path, columns=names).to_pandas()


def iter_table(
    path: str | os.PathLike, name: str, columns: list[str] | None = None, batch_rows: int = 1 << 16
) -> Iterator[pd.DataFrame]:
    """Read a checked table in pieces of about ``batch_rows`` rows (a stage that streams)."""
    for batch in iter_batches(path, name, columns, batch_rows):
        yield batch.to_pandas()


def iter_batches(
    path: str | os.PathLike, name: str, columns: list[str] | None = None, batch_rows: int = 1 << 16
) -> Iterator[pa.RecordBatch]:
    """:func:`iter_table` as Arrow record batches: ids stay Arrow strings, never a Python object
    per id (for a pass that only collects or looks up ids)."""
    path = Path(path)
    names = _checked_columns(path, name, columns)
    # No pre-buffering: with it (pyarrow's default) the reader holds about the whole file while
    # the batches stream (442 MB peak for a 257 MB file, 226 MB without).
    yield from pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=batch_rows, columns=names)


def read_rows(
    path: str | os.PathLike,
    name: str,
    rows: np.ndarray,
    columns: list[str] | None = None,
    batch_rows: int = 1 << 16,
) -> pd.DataFrame:
    """The checked table's rows at positions ``rows``, in that order, read piece by piece: memory
    follows the rows asked for (one shard of a corpus), not the table."""
    rows = np.asarray(rows, dtype=np.int64)
    wanted = np.unique(rows)
    parts, offset = [], 0
    for piece in iter_table(path, name, columns, batch_rows):
        lo, hi = np.searchsorted(wanted, [offset, offset + len(piece)])
        if hi > lo:
            part = piece.iloc[wanted[lo:hi] - offset]
            part.index = wanted[lo:hi]
            parts.append(part)
        offset += len(piece)
    if len(wanted) and (wanted[0] < 0 or wanted[-1] >= offset):
        raise IndexError(f"{path}: rows {wanted[0]}..{wanted[-1]} asked of a table of {offset} rows")
    names = list(columns) if columns else schema(name).names
    table = pd.concat(parts) if parts else pd.DataFrame(columns=names)
    return table.loc[rows].reset_index(drop=True)


def iter_query_groups(
    path: str | os.PathLike, name: str, columns: list[str] | None = None, batch_rows: int = 1 << 20
) -> Iterator[pd.DataFrame]:
    """Read a table stored query by query (runs, negatives, scores: each query's rows together, in
    any query order) in pieces that hold every row of each of their queries: a query cut by a
    batch boundary moves whole to the next piece. A query whose rows are apart (found again in a
    later piece) is a :class:`SchemaError`: a stage computing per query from the pieces would
    otherwise give it twice, each half on its own."""
    carry: pd.DataFrame | None = None
    seen: set[str] = set()  # the queries of the pieces given so far (502k ids for MS MARCO: ~40 MB)

    def checked(piece: pd.DataFrame) -> pd.DataFrame:
        queries = set(piece["query_id"].unique())
        again = queries & seen
        if again:
            raise SchemaError(
                f"{path}: the rows of query {min(again)!r} are not together (more of them follow "
                f"other queries' rows); a {name!r} table must keep each query's rows together, as "
                "the stages write it"
            )
        seen.update(queries)
        return piece.reset_index(drop=True)

    for piece in iter_table(path, name, columns, batch_rows):
        if carry is not None and len(carry):
            piece = pd.concat([carry, piece], ignore_index=True)
        last = piece["query_id"].iat[-1] if len(piece) else None
        tail = piece["query_id"].to_numpy() == last
        carry = piece[tail]
        if (~tail).any():
            yield checked(piece[~tail])
    if carry is not None and len(carry):
        yield checked(carry)
