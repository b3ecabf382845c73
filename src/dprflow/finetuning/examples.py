"""Training examples of the fine-tuning stages: queries with positives, negative pools and groups.

A training query is kept when it has at least one positive passage (a passage of a document
judged relevant) and a non-empty negative pool; the others are skipped, counted and logged by
reason, never silently. Positives are never sampled as negatives: pools are built from runs with
the positives removed (:func:`dprflow.search.runs.negatives_from_run`) and are checked again here.

A group is ``[positive, negative_1, ..., negative_{G-1}]``: one positive drawn at random among
the query's positives and ``G - 1`` negatives drawn from its pool (without replacement when the
pool is large enough, else with replacement, as Tevatron does), optionally a fraction of them from
a second pool (BM25 negatives mixed into retriever 2's). Drawing with replacement is never silent:
the queries whose pool is smaller than the group are counted and logged, and a group larger than
every query's pool is an error naming ``--group-size`` (:func:`check_pools`).

At paper scale (MS MARCO: 502k training queries, 1,000 BM25 negatives each, 8.8M passages) the
pools are read into integer arrays, 4 bytes a candidate (:class:`Pools`, one pass to count and one
to fill, a million rows at a time), and the texts of the passages are written once to a file
beside the stage's output and read a batch at a time (:class:`PassageTexts`): what stays resident
is the pools, the passage ids (to resolve the tables' ids) and the queries' texts, never the
corpus's text or a Python object per candidate. The groups drawn are those of the former
whole-table path (the same pool order, the same draws), so a seed gives the same batches.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dprflow.data.ids import IdIndex
from dprflow.data.schemas import iter_table, read_table
from dprflow.errors import StageError
from dprflow.models.texts import encoder_texts
from dprflow.search.runs import read_positive_passages
from dprflow.stage_args import TrainArgs

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class GroupTrainingArgs(TrainArgs):
    """The arguments every group-trained fine-tuning stage shares (retrievers and the reranker)."""

    init: str = field(metadata={"help": "initial checkpoint (a pre-trained encoder or model.init)"})
    queries: str = field(metadata={"help": "queries.parquet"})
    qrels: str = field(metadata={"help": "qrels.parquet"})
    passages: str = field(metadata={"help": "passages.parquet"})
    negatives: str = field(metadata={"help": "negatives.parquet: each query's pool"})
    out: str = field(metadata={"help": "model folder to write"})
    checkpoint_dir: str = field(metadata={"help": "resumable checkpoints (kept across failures)"})
    split: str = field(default="train", metadata={"help": "training query split"})
    group_size: int = field(default=4, metadata={"help": "passages per query (1 positive)"})
    batch_size: int = field(default=8, metadata={"help": "queries per step (all processes)"})
    learning_rate: float = field(default=2e-5, metadata={"help": "AdamW peak learning rate"})
    selection: list[str] = field(
        default_factory=list,
        metadata={
            "help": "selection.json files (stage select_settings): their chosen settings replace these flags'"
        },
    )


@dataclass
class TrainingQuery:
    """One training query; positives and negatives are passage rows (:class:`PassageTexts`) or ids."""

    query_id: str
    text: str
    positives: Sequence[Any]
    negatives: Sequence[Any]
    extra_negatives: Sequence[Any] = ()  # the second pool (may be empty)
    teacher: dict[Any, float] = field(default_factory=dict)  # reranker scores (distillation)


class PassageTexts:
    """Passage row (its place in ``passages.parquet``) -> its
    :func:`~dprflow.models.texts.encoder_texts`, read from disk.

    :meth:`write` streams the passages table into ``texts.bin`` (the UTF-8 texts, one after the
    other) and ``offsets.npy`` (``int64 [n + 1]``) in a folder; a text is one ``pread``, so the
    memory a batch costs is its own texts (no memory map whose touched pages would add up to the
    corpus over a long run). It reopens its file in another process (DataLoader workers)."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self._fd, self._pid = -1, -1
        self.folder = Path(folder)
        self.offsets = np.load(self.folder / "offsets.npy", mmap_mode="r")

    @classmethod
    def write(
        cls, passages: str | os.PathLike, folder: str | os.PathLike, sep_token: str
    ) -> tuple[PassageTexts, IdIndex]:
        """Write the texts of table ``passages``; returns them and the index of the passage ids."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        ids, ends, end = [], [np.zeros(1, np.int64)], 0
        with open(folder / "texts.bin", "wb") as fh:
            for piece in iter_table(passages, "passages", ["passage_id", "title", "text"], 1 << 16):
                encoded = [t.encode() for t in encoder_texts(piece, sep_token)]
                fh.write(b"".join(encoded))
                lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
                ends.append(end + np.cumsum(lengths))
                end += int(lengths.sum())
                ids.append(pa.array(piece["passage_id"], pa.string()))
        np.save(folder / "offsets.npy", np.concatenate(ends))
        index = IdIndex(pa.chunked_array(ids, pa.string()).combine_chunks())
        if (dup := index.duplicate()) is not None:
            raise StageError(f"{passages}: passage id {dup!r} is on more than one row")
        return cls(folder), index

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> str:
        if os.getpid() != self._pid:  # first read in this process
            self._fd, self._pid = os.open(self.folder / "texts.bin", os.O_RDONLY), os.getpid()
        start, stop = int(self.offsets[row]), int(self.offsets[row + 1])
        return os.pread(self._fd, stop - start, start).decode()

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["folder"])

    def __del__(self, _getpid=os.getpid, _close=os.close) -> None:  # os may be gone at exit
        if self._pid == _getpid():
            _close(self._fd)


@dataclass
class Pools:
    """Each query's passages, query ``q``'s being ``rows[offsets[q]:offsets[q + 1]]`` (CSR)."""

    offsets: np.ndarray  # int64 [n_queries + 1]
    rows: np.ndarray  # int32 passage rows

    def __getitem__(self, q: int) -> np.ndarray:
        return self.rows[self.offsets[q] : self.offsets[q + 1]]

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def query_of(self, lo: int, hi: int) -> np.ndarray:
        """The query of each entry of queries ``lo..hi-1``."""
        return np.repeat(np.arange(lo, hi), self.sizes[lo:hi])

    def blocks(self, entries: int = 1 << 22) -> Iterator[tuple[int, int]]:
        """Query ranges ``(lo, hi)`` of about ``entries`` entries each (bounded scratch arrays)."""
        lo, n = 0, len(self.offsets) - 1
        while lo < n:
            hi = int(np.searchsorted(self.offsets, self.offsets[lo] + entries, side="right")) - 1
            hi = min(max(hi, lo + 1), n)
            yield lo, hi
            lo = hi

    def keep(self, mask: np.ndarray) -> Pools:
        """The pools without the entries where ``mask`` is False."""
        kept = np.zeros(len(self.offsets), np.int64)
        for lo, hi in self.blocks():
            span = slice(self.offsets[lo], self.offsets[hi])
            kept[lo + 1 : hi + 1] = np.bincount(self.query_of(lo, hi)[mask[span]] - lo, minlength=hi - lo)
        return Pools(np.cumsum(kept), self.rows[mask])


def read_pools(
    pieces: Callable[[list[str]], Iterable[pd.DataFrame]],
    queries: IdIndex,
    passages: IdIndex,
    order: str | None,
    where: str,
) -> Pools:
    """The pools of ``queries`` in rows of (query_id, passage_id[, order]) given by
    ``pieces(columns)`` (called twice: one pass counts the query ids, one fills), each query's in ``order`` (an integer column;
    stable: rows of equal order keep the table's order), or in the table's order. Rows of other queries are skipped;
    a passage id that is not in ``passages`` is an error naming ``where``."""
    counts = np.zeros(len(queries), np.int64)
    for piece in pieces(["query_id"]):
        q = queries.column_rows(piece["query_id"])
        counts += np.bincount(q[q >= 0], minlength=len(queries))
    offsets = np.zeros(len(queries) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    rows = np.empty(offsets[-1], np.int32)
    keys = np.empty(offsets[-1], np.int32) if order else None  # ranks: int32 in every pool table
    fill = offsets[:-1].copy()
    for piece in pieces(["query_id", "passage_id"] + ([order] if order else [])):
        q = queries.column_rows(piece["query_id"])
        piece, q = piece[q >= 0], q[q >= 0]
        if not len(q):  # no row of these queries here (an empty piece, or qrels of none of them)
            continue
        p = passages.column_rows(piece["passage_id"])
        if (p < 0).any():
            bad = piece.iloc[int(np.argmax(p < 0))]
            raise StageError(
                f"{where}: passage {bad['passage_id']!r} (query {bad['query_id']!r}) is not in the "
                "passages table: the pools and the passages come from different collections or splits"
            )
        by_query = np.argsort(q, kind="stable")
        q = q[by_query]
        first = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
        run = np.diff(np.r_[first, len(q)])
        at = fill[q] + np.arange(len(q)) - np.repeat(first, run)
        rows[at] = p[by_query]
        if keys is not None:
            keys[at] = piece[order].to_numpy()[by_query]
        fill[q[first]] += run
    if keys is not None and len(keys) > 1:
        falls = np.diff(keys) < 0
        starts = offsets[1:-1]
        falls[starts[(starts > 0) & (starts < len(keys))] - 1] = False  # a new query may start lower
        if falls.any():
            query = np.repeat(np.arange(len(queries)), counts)
            rows = rows[np.lexsort((keys, query))]
    return Pools(offsets, rows)


def without_positives(pools: Pools, positives: Pools, n_passages: int) -> tuple[Pools, np.ndarray]:
    """The pools with each query's positives removed, and how many were removed per query."""
    known = np.sort(positives.query_of(0, len(positives.offsets) - 1) * n_passages + positives.rows)
    hit = np.zeros(len(pools.rows), bool)
    for lo, hi in pools.blocks():
        span = slice(pools.offsets[lo], pools.offsets[hi])
        hit[span] = _member(pools.query_of(lo, hi) * n_passages + pools.rows[span], known)
    kept = pools.keep(~hit)
    return kept, pools.sizes - kept.sizes


def _member(keys: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Whether each of ``keys`` is in the sorted array ``known``."""
    if not len(known):
        return np.zeros(len(keys), bool)
    at = np.minimum(np.searchsorted(known, keys), len(known) - 1)
    return known[at] == keys


class TeacherScores:
    """The reranker's score of (query, passage) pairs, as sorted int64 keys and float32 scores."""

    def __init__(self, path: str, queries: IdIndex, passages: IdIndex) -> None:
        self.n_passages = len(passages)
        keys, scores = [], []
        for piece in iter_table(path, "scores", batch_rows=1 << 20):
            q = queries.column_rows(piece["query_id"])
            p = passages.column_rows(piece["passage_id"])
            ok = (q >= 0) & (p >= 0)  # pairs of other queries, or of no passage, are never looked up
            keys.append(q[ok].astype(np.int64) * self.n_passages + p[ok])
            scores.append(piece["score"].to_numpy(np.float32)[ok])
        keys_all = np.concatenate(keys) if keys else np.empty(0, np.int64)
        order = np.argsort(keys_all, kind="stable")
        self.keys, self.scores = keys_all[order], (np.concatenate(scores) if scores else np.empty(0))[order]

    def lookup(self, pools: Pools) -> tuple[np.ndarray, np.ndarray]:
        """Whether each pool entry has a score, and the score (NaN where none)."""
        found = np.zeros(len(pools.rows), bool)
        values = np.full(len(pools.rows), np.nan, np.float32)
        for lo, hi in pools.blocks():
            span = slice(pools.offsets[lo], pools.offsets[hi])
            keys = pools.query_of(lo, hi) * self.n_passages + pools.rows[span]
            # The last row of a pair scored twice, as a dict built from the table would keep.
            at = np.searchsorted(self.keys, keys, side="right") - 1
            hit = (at >= 0) & (self.keys[np.maximum(at, 0)] == keys)
            found[span], values[span] = hit, np.where(hit, self.scores[np.maximum(at, 0)], np.nan)
        return found, values


class TrainingSet(Sequence):
    """The kept training queries; item ``i`` is a :class:`TrainingQuery` built when asked for."""

    def __init__(
        self,
        query_ids: np.ndarray,
        texts: np.ndarray,
        kept: np.ndarray,
        positives: Pools,
        negatives: Pools,
        extra: Pools | None = None,
        teacher: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.query_ids, self.texts, self.kept = query_ids, texts, kept
        self.positives, self.negatives, self.extra, self.teacher = positives, negatives, extra, teacher

    def __len__(self) -> int:
        return len(self.kept)

    @property
    def pool_sizes(self) -> np.ndarray:
        return self.negatives.sizes[self.kept]

    def __getitem__(self, i: int) -> TrainingQuery:
        if not -len(self) <= i < len(self):
            raise IndexError(f"training query {i} of {len(self)}")
        q = int(self.kept[i])
        item = TrainingQuery(
            str(self.query_ids[q]),
            str(self.texts[q]),
            self.positives[q],
            self.negatives[q],
            self.extra[q] if self.extra is not None else (),
        )
        if self.teacher is not None:
            pos, neg = self.teacher
            scores = np.concatenate(
                [
                    pos[self.positives.offsets[q] : self.positives.offsets[q + 1]],
                    neg[self.negatives.offsets[q] : self.negatives.offsets[q + 1]],
                ]
            )
            rows = np.concatenate([item.positives, item.negatives])
            item.teacher = dict(zip(rows.tolist(), scores.tolist(), strict=True))
        return item


def build_training_set(
    queries: pd.DataFrame,
    split: str,
    positives: pd.DataFrame,
    passage_ids: IdIndex,
    negatives: Callable[[list[str]], Iterable[pd.DataFrame]],
    extra_negatives: Callable[[list[str]], Iterable[pd.DataFrame]] | None = None,
    teacher: str | None = None,
    where: str = "negatives",
    qrels: str = "qrels",
) -> tuple[TrainingSet, dict[str, int]]:
    """Assemble the training queries of ``split``; returns them and the counts of what was skipped.

    ``positives``: (query_id, passage_id) pairs (:func:`dprflow.search.runs.positive_passages`);
    ``negatives`` and ``extra_negatives`` give the pool tables' pieces of the columns asked for
    (``negatives`` schema),
    ``teacher`` is a ``scores`` table; passages are rows of ``passage_ids``; ``where`` and
    ``qrels`` name the pools' and the positives' files in errors."""
    chosen = queries[queries["split"] == split]
    if chosen.empty:
        raise StageError(f"no query of split {split!r}; splits: {sorted(set(queries['split']))}")
    qids = IdIndex(pa.array(chosen["query_id"], pa.string()))
    if (dup := qids.duplicate()) is not None:
        raise StageError(f"query id {dup!r} is on more than one row of split {split!r} of the queries")
    n = len(passage_ids)
    # Each query's positives in the order of the merge (as the former groupby kept them).
    ordered = positives.sort_values("query_id", kind="stable")
    pos = read_pools(lambda columns: [ordered[columns]], qids, passage_ids, None, qrels)
    pools, removed = without_positives(read_pools(negatives, qids, passage_ids, "rank", where), pos, n)
    extra = None
    if extra_negatives is not None:
        extra, _ = without_positives(read_pools(extra_negatives, qids, passage_ids, "rank", where), pos, n)
    has_pos = pos.sizes > 0
    counts = {
        "queries": len(chosen),
        "skipped_no_positive": int((~has_pos).sum()),
        "skipped_empty_negative_pool": int((has_pos & (pools.sizes == 0)).sum()),
        "skipped_no_teacher_scores": 0,
        "negatives_that_were_positives_removed": int(removed[has_pos].sum()),
    }
    keep = has_pos & (pools.sizes > 0)
    scores = None
    if teacher is not None:
        # Only candidates the reranker scored can be distilled from.
        table = TeacherScores(teacher, qids, passage_ids)
        pos_found, pos_scores = table.lookup(pos)
        neg_found, neg_scores = table.lookup(pools)
        pos, pools = pos.keep(pos_found), pools.keep(neg_found)
        scores = (pos_scores[pos_found], neg_scores[neg_found])
        scored = (pos.sizes > 0) & (pools.sizes > 0)
        counts["skipped_no_teacher_scores"] = int((keep & ~scored).sum())
        keep &= scored
    kept = np.flatnonzero(keep)
    counts["kept"] = len(kept)
    for reason, value in counts.items():
        log.info("training queries, %s: %d", reason, value)
    if not len(kept):
        why = ""
        if counts["skipped_no_positive"] == counts["queries"]:
            why = (
                f"; none of them has a relevant passage (a qrels row of relevance > 0 whose document "
                f"has passages) in {qrels}: check that file's relevance column and split {split!r}"
            )
        raise StageError(f"no usable training query in split {split!r}: {counts}{why}")
    texts = chosen["text"].to_numpy(object)
    query_ids = chosen["query_id"].to_numpy(object)
    return TrainingSet(query_ids, texts, kept, pos, pools, extra, scores), counts


def sample_group(
    rng: np.random.Generator, item: TrainingQuery, group_size: int, extra_fraction: float = 0.0
) -> list[Any]:
    """``[positive] + (group_size - 1)`` negatives of one query (see the module docstring)."""
    positive = item.positives[int(rng.integers(len(item.positives)))]
    n_neg = group_size - 1
    n_extra = int(round(n_neg * extra_fraction)) if len(item.extra_negatives) else 0
    chosen = _draw(rng, item.negatives, n_neg - n_extra) + _draw(rng, item.extra_negatives, n_extra)
    return [positive] + chosen


def _draw(rng: np.random.Generator, pool: Sequence[Any], n: int) -> list[Any]:
    if n <= 0:
        return []
    idx = rng.choice(len(pool), size=n, replace=len(pool) < n)
    return [pool[i] for i in idx]


def read_training_examples(
    args: Any, tokenizer: Any, scratch: str, extra_negatives: str | None = None, teacher: str | None = None
) -> tuple[TrainingSet, dict[str, int], PassageTexts]:
    """The training queries of a :class:`GroupTrainingArgs` stage, their skip counts, and the
    passage texts the encoders see (written to ``scratch``, with the tokenizer's separator)."""
    texts, passage_ids = PassageTexts.write(
        args.passages, Path(scratch) / "texts", tokenizer.sep_token or "|"
    )

    def pieces(path: str) -> Callable[[list[str]], Iterable[pd.DataFrame]]:
        return lambda columns: iter_table(path, "negatives", columns, 1 << 20)

    items, counts = build_training_set(
        read_table(args.queries, "queries", ["query_id", "text", "split"]),
        args.split,
        read_positive_passages(args.qrels, args.passages),
        passage_ids,
        pieces(args.negatives),
        pieces(extra_negatives) if extra_negatives else None,
        teacher,
        where=args.negatives,
        qrels=args.qrels,
    )
    check_pools(items.pool_sizes, args.group_size)
    return items, counts, texts


def check_pools(pool_sizes: Sequence[int], group_size: int) -> int:
    """Count (and log) the queries whose negative pool is smaller than a group's ``group_size - 1``
    negatives: their groups repeat negatives. When no query's pool is large enough the group size
    is a mistake, not a shortage: an error. Returns the number of short queries."""
    need = group_size - 1
    sizes = np.asarray(pool_sizes, np.int64)
    short = sizes[sizes < need]
    if len(sizes) and len(short) == len(sizes):
        largest = int(sizes.max())
        raise StageError(
            f"--group-size {group_size} needs {need} negatives per query but no training query has that "
            f"many (largest pool: {largest}); lower the group size (finetune.retriever, finetune.reranker "
            f"or finetune.distill .group_size) to at most {largest + 1}, or deepen the pools "
            "(bm25.negatives_depth, finetune.mining_depth, finetune.reranker.depth, finetune.distill.candidates)"
        )
    if len(short):
        log.warning(
            "%d of %d training queries have fewer than %d negatives in their pool (smallest: %d): their "
            "groups of %d draw negatives with replacement, repeating some",
            len(short),
            len(sizes),
            need,
            int(short.min()),
            group_size,
        )
    return len(short)
