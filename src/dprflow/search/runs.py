"""Runs and negative pools: TREC output, positives per query, and negatives from a run.

The TREC files are the formats trec_eval, ir_measures, ranx and pyserini read: a run line is
``query_id Q0 id rank score tag`` and a qrels line ``query_id 0 doc_id relevance``. Scores are
written with nine significant digits, which gives back every float32 score exactly, so a tool
reading the file ranks (and breaks ties) as the Parquet run does.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from dprflow.data.ids import IdIndex, id_set, in_set
from dprflow.data.schemas import TableWriter, iter_batches, iter_table, read_table
from dprflow.files import atomic_path

log = logging.getLogger(__name__)


def write_run(
    run: pd.DataFrame, parquet_path: str | Path, trec_path: str | Path | None = None, tag: str = "dprflow"
) -> None:
    """Write a run as Parquet (the ``run`` schema) and optionally as a TREC run file."""
    write_run_pieces([run], parquet_path, trec_path, tag)


def write_run_pieces(
    pieces: Iterable[pd.DataFrame],
    parquet_path: str | Path,
    trec_path: str | Path | None = None,
    tag: str = "dprflow",
) -> dict[str, int]:
    """:func:`write_run` of a run given in pieces, one in memory at a time; both files appear only
    when every piece is written. Returns the numbers of rows and of distinct queries."""
    counts = {"rows": 0, "queries": 0}
    with ExitStack() as stack:
        writer = stack.enter_context(TableWriter(parquet_path, "run"))
        trec = None
        if trec_path is not None:
            trec = stack.enter_context(open(stack.enter_context(atomic_path(trec_path)), "w"))
        for run in pieces:
            writer.write(run)
            counts["rows"] += len(run)
            counts["queries"] += run["query_id"].nunique()
            if trec is not None:
                write_trec_lines(trec, run, "passage_id", tag)
    return counts


def trec_lines(run: pd.DataFrame, id_column: str, tag: str) -> list[str]:
    """TREC run lines of ``run`` (``query_id``, ``id_column``, ``score``, ``rank``); scores at 9
    significant digits, so a float32 score reads back exactly and ties stay ties."""
    columns = (  # as Python lists: iterating Arrow-backed columns row by row is 10x slower
        run["query_id"].tolist(),
        run[id_column].tolist(),
        run["score"].to_numpy(dtype=np.float64).tolist(),
        run["rank"].tolist(),
    )
    return [
        f"{qid} Q0 {pid} {rank} {score:.9g} {tag}\n" for qid, pid, score, rank in zip(*columns, strict=True)
    ]


def write_trec_lines(fh, run: pd.DataFrame, id_column: str, tag: str) -> None:
    """Write :func:`trec_lines` of ``run`` to ``fh``."""
    fh.writelines(trec_lines(run, id_column, tag))


def write_trec_run(run: pd.DataFrame, path: str | Path, id_column: str, tag: str) -> None:
    """A TREC run file of ``run`` (``query_id``, ``id_column``, ``score``, ``rank``)."""
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        write_trec_lines(fh, run, id_column, tag)


class SortedTrecRun:
    """A TREC run file written from pieces of whole queries that come in any query order, with
    the queries in ``query_id`` order in the file, as :func:`write_trec_run` of the concatenated
    pieces sorted by query_id gives it, without holding the run: each piece's lines go to a
    scratch file as they come, memory keeps where each query's lines are, and :meth:`copy_sorted`
    copies the queries in order at the end. Open one with :func:`sorted_trec_run`."""

    def __init__(self, scratch, id_column: str, tag: str):
        self.scratch, self.id_column, self.tag = scratch, id_column, tag
        self.where: dict[str, tuple[int, int]] = {}  # query_id -> (offset, bytes) in the scratch file

    def write(self, run: pd.DataFrame) -> None:
        """Add ``run``'s queries: rows in rank order within each query, each query's rows together.
        A query given in two pieces is a ``ValueError``."""
        lines = trec_lines(run, self.id_column, self.tag)
        qids = run["query_id"].to_numpy()
        bounds = np.flatnonzero(qids[1:] != qids[:-1]) + 1
        for start, stop in zip([0, *bounds], [*bounds, len(qids)], strict=True):
            if not stop > start:
                continue
            qid = qids[start]
            if qid in self.where:
                raise ValueError(f"the TREC lines of query {qid!r} come in two pieces")
            data = "".join(lines[start:stop]).encode()
            self.where[qid] = (self.scratch.tell(), len(data))
            self.scratch.write(data)

    def copy_sorted(self, out) -> None:
        """Write every query's lines to the binary file ``out``, queries in query_id order."""
        for qid in sorted(self.where):
            offset, size = self.where[qid]
            self.scratch.seek(offset)
            out.write(self.scratch.read(size))


@contextmanager
def sorted_trec_run(path: str | Path, id_column: str, tag: str) -> Iterator[SortedTrecRun]:
    """A :class:`SortedTrecRun` to write pieces to; the file appears at ``path`` when the block
    ends without an error (atomically), its scratch file beside it removed either way."""
    path = Path(path)
    with atomic_path(path) as tmp, tempfile.TemporaryFile(dir=path.parent) as scratch:
        run = SortedTrecRun(scratch, id_column, tag)
        yield run
        with open(tmp, "wb") as out:
            run.copy_sorted(out)


def write_trec_qrels(qrels: pd.DataFrame, path: str | Path) -> None:
    """A TREC qrels file of ``qrels`` (``query_id``, ``doc_id``, ``relevance``)."""
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        for qid, did, rel in qrels[["query_id", "doc_id", "relevance"]].itertuples(index=False):
            fh.write(f"{qid} 0 {did} {int(rel)}\n")


def positive_passages(qrels: pd.DataFrame, passages: pd.DataFrame) -> pd.DataFrame:
    """(query_id, passage_id) of every passage of every relevant (relevance > 0) document."""
    rel = qrels.loc[qrels["relevance"] > 0, ["query_id", "doc_id"]]
    return rel.merge(passages[["passage_id", "doc_id"]], on="doc_id")[["query_id", "passage_id"]]


def run_passages(
    passages_path: str | Path, passage_ids: Iterable[str], columns: list[str] | None = None
) -> pd.DataFrame:
    """The passages among ``passage_ids``, read piece by piece, so memory follows the run rather
    than the corpus; ``columns`` (default: passage_id and doc_id, no text) are those read."""
    columns = columns or ["passage_id", "doc_id"]
    wanted = id_set(passage_ids)
    parts = [
        piece[in_set(piece["passage_id"], wanted)]
        for piece in iter_table(passages_path, "passages", columns, batch_rows=1 << 18)
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


class RunParents:
    """The document of each passage a run names, for MaxP over a run read in pieces: one pass over
    the run's passage ids and one over the passages table's (passage_id, doc_id), kept as Arrow
    strings and an :class:`~dprflow.data.ids.IdIndex` (:meth:`~dprflow.data.ids.IdIndex.of_distinct`),
    never a Python object per passage: about 30 bytes a distinct passage of the run, where
    :func:`run_passages` as pandas holds about 250."""

    def __init__(self, run_path: str | Path, passages_path: str | Path, batch_rows: int = 1 << 18):
        self.passages_path = passages_path
        self.index = IdIndex.of_distinct(
            batch.column(0) for batch in iter_batches(run_path, "run", ["passage_id"], batch_rows)
        )
        rows, docs = [], []
        for batch in iter_batches(passages_path, "passages", ["passage_id", "doc_id"], batch_rows):
            at = self.index.rows(batch.column(0))
            keep = at >= 0
            rows.append(at[keep])
            docs.append(batch.column(1).filter(pa.array(keep)))
        rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        if len(np.unique(rows)) < len(rows):
            counts = np.bincount(rows, minlength=len(self.index))
            twice = self.index.sorted[int(np.flatnonzero(counts > 1)[0])].decode()
            raise ValueError(f"{passages_path}: passage {twice!r} is on more than one row")
        self.found = np.zeros(len(self.index), dtype=bool)
        self.found[rows] = True
        order = np.empty(len(self.index), dtype=np.int64)
        order[rows] = np.arange(len(rows))
        docs = pa.chunked_array(docs, pa.string()).combine_chunks() if docs else pa.array([], pa.string())
        self.doc_ids = docs.take(pa.array(np.where(self.found, order, 0))) if len(docs) else docs

    def __len__(self) -> int:
        return len(self.index)

    def of(self, passage_ids: pd.Series) -> pd.Series:
        """The document of each of ``passage_ids`` (a run's column; all of them in the run this
        was built from), as a pandas column beside it."""
        at = self.index.column_rows(passage_ids)
        missing = at < 0
        missing[~missing] = ~self.found[at[~missing]]
        if missing.any():
            raise ValueError(
                f"run names passage {passage_ids.iat[int(np.flatnonzero(missing)[0])]!r}, which is "
                f"not in the passages table {self.passages_path}"
            )
        return pd.Series(self.doc_ids.take(pa.array(at)).to_pandas(), index=passage_ids.index)


def read_positive_passages(qrels_path: str | Path, passages_path: str | Path) -> pd.DataFrame:
    """:func:`positive_passages` of two tables on disk, reading of the passages only the ids of
    the judged documents' passages (not the corpus's text), so memory follows the qrels."""
    qrels = read_table(qrels_path, "qrels")
    judged = id_set(qrels.loc[qrels["relevance"] > 0, "doc_id"])
    parts = [
        piece[in_set(piece["doc_id"], judged)]
        for piece in iter_table(passages_path, "passages", ["passage_id", "doc_id"], batch_rows=1 << 18)
    ]
    passages = (
        pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["passage_id", "doc_id"])
    )
    return positive_passages(qrels, passages)


def negatives_from_run(
    run: pd.DataFrame, positives: pd.DataFrame, depth: int, level: int = logging.INFO
) -> pd.DataFrame:
    """The top ``depth`` passages of each query minus its positives, re-ranked from 1 (``negatives`` schema).

    Each query's rows are handled on their own, so a run given in pieces of whole queries (as
    :func:`write_negatives` reads it) gives the same rows piece by piece."""
    top = run[run["rank"] <= depth]
    flagged = top.merge(positives.assign(_pos=True), on=["query_id", "passage_id"], how="left")
    negatives = flagged[flagged["_pos"].isna()].drop(columns="_pos")
    removed = len(top) - len(negatives)
    negatives = negatives.sort_values(["query_id", "rank"], kind="stable").copy()
    negatives["rank"] = negatives.groupby("query_id").cumcount() + 1
    log.log(
        level,
        "negatives: %d candidates in the top %d, %d positives removed, %d kept for %d queries",
        len(top),
        depth,
        removed,
        len(negatives),
        negatives["query_id"].nunique(),
    )
    return negatives[["query_id", "passage_id", "score", "rank"]].reset_index(drop=True)


def write_negatives(
    pieces: Iterable[pd.DataFrame], positives: pd.DataFrame, depth: int, out: str | Path
) -> dict[str, int]:
    """Stream :func:`negatives_from_run` over a run given in pieces of whole queries (in query_id
    order for a table identical to the whole-run path; any order gives the same rows) into the
    ``negatives`` table at ``out``, one piece in memory at a time. Returns counts for the log."""
    counts = {"queries": 0, "candidates": 0, "negatives": 0}
    with TableWriter(out, "negatives") as writer:
        for piece in pieces:
            pool = negatives_from_run(piece, positives, depth, level=logging.DEBUG)
            writer.write(pool)
            counts["queries"] += pool["query_id"].nunique()
            counts["candidates"] += int((piece["rank"] <= depth).sum())
            counts["negatives"] += len(pool)
    log.info(
        "negatives: %d candidates in the top %d, %d positives removed, %d kept for %d queries",
        counts["candidates"],
        depth,
        counts["candidates"] - counts["negatives"],
        counts["negatives"],
        counts["queries"],
    )
    return counts
