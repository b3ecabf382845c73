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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dprflow.cli import StageError
from dprflow.data.schemas import read_table
from dprflow.search.runs import positive_passages
from dprflow.stage_args import OptimArgs

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class GroupTrainingArgs(OptimArgs):
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


@dataclass
class TrainingQuery:
    query_id: str
    text: str
    positives: list[str]
    negatives: list[str]
    extra_negatives: list[str] = field(default_factory=list)  # the second pool (may be empty)
    teacher: dict[str, float] = field(default_factory=dict)  # reranker scores (distillation)


def passage_texts(passages: pd.DataFrame, sep_token: str) -> dict[str, str]:
    """Passage id -> the text the encoders see: ``title [SEP] text`` (just the text without a title)."""
    titles = passages["title"].str.strip()
    texts = np.where(titles.eq(""), passages["text"], titles + f" {sep_token} " + passages["text"])
    return dict(zip(passages["passage_id"], texts, strict=True))


def _pools(negatives: pd.DataFrame | None) -> dict[str, list[str]]:
    if negatives is None:
        return {}
    ordered = negatives.sort_values(["query_id", "rank"], kind="stable")
    return ordered.groupby("query_id", sort=False)["passage_id"].agg(list).to_dict()


def build_training_queries(
    queries: pd.DataFrame,
    split: str,
    qrels: pd.DataFrame,
    passages: pd.DataFrame,
    negatives: pd.DataFrame,
    extra_negatives: pd.DataFrame | None = None,
    teacher: pd.DataFrame | None = None,
) -> tuple[list[TrainingQuery], dict[str, int]]:
    """Assemble the training queries of ``split``; returns them and the counts of what was skipped."""
    chosen = queries[queries["split"] == split]
    if chosen.empty:
        raise StageError(f"no query of split {split!r}; splits: {sorted(set(queries['split']))}")
    positives = positive_passages(qrels, passages).groupby("query_id")["passage_id"].agg(list).to_dict()
    pools, extra = _pools(negatives), _pools(extra_negatives)
    scores: dict[str, dict[str, float]] = {}
    if teacher is not None:
        for qid, group in teacher.groupby("query_id", sort=False):
            scores[qid] = dict(zip(group["passage_id"], group["score"].astype(float), strict=True))
    counts = {
        "queries": len(chosen),
        "skipped_no_positive": 0,
        "skipped_empty_negative_pool": 0,
        "skipped_no_teacher_scores": 0,
        "negatives_that_were_positives_removed": 0,
    }
    items = []
    for qid, text in chosen[["query_id", "text"]].itertuples(index=False):
        pos = positives.get(qid, [])
        if not pos:
            counts["skipped_no_positive"] += 1
            continue
        pos_set = set(pos)
        pool = pools.get(qid, [])
        clean = [p for p in pool if p not in pos_set]
        counts["negatives_that_were_positives_removed"] += len(pool) - len(clean)
        if not clean:
            counts["skipped_empty_negative_pool"] += 1
            continue
        item = TrainingQuery(qid, text, pos, clean, [p for p in extra.get(qid, []) if p not in pos_set])
        if teacher is not None:
            item.teacher = scores.get(qid, {})
            missing = [p for p in pos + clean if p not in item.teacher]
            if missing:
                # Only candidates the reranker scored can be distilled from.
                item.positives = [p for p in pos if p in item.teacher]
                item.negatives = [p for p in clean if p in item.teacher]
                if not item.positives or not item.negatives:
                    counts["skipped_no_teacher_scores"] += 1
                    continue
        items.append(item)
    counts["kept"] = len(items)
    for reason, n in counts.items():
        log.info("training queries, %s: %d", reason, n)
    if not items:
        raise StageError(f"no usable training query in split {split!r}: {counts}")
    return items, counts


def sample_group(
    rng: np.random.Generator, item: TrainingQuery, group_size: int, extra_fraction: float = 0.0
) -> list[str]:
    """``[positive] + (group_size - 1)`` negatives of one query (see the module docstring)."""
    positive = item.positives[int(rng.integers(len(item.positives)))]
    n_neg = group_size - 1
    n_extra = int(round(n_neg * extra_fraction)) if item.extra_negatives else 0
    chosen = _draw(rng, item.negatives, n_neg - n_extra) + _draw(rng, item.extra_negatives, n_extra)
    return [positive] + chosen


def _draw(rng: np.random.Generator, pool: list[str], n: int) -> list[str]:
    if n <= 0:
        return []
    idx = rng.choice(len(pool), size=n, replace=len(pool) < n)
    return [pool[i] for i in idx]


def read_training_examples(
    args: Any, tokenizer: Any, extra_negatives: str | None = None, teacher: str | None = None
) -> tuple[list[TrainingQuery], dict[str, int], dict[str, str]]:
    """The training queries of a :class:`GroupTrainingArgs` stage, their skip counts, and the
    passage texts the encoders see (:func:`passage_texts` with the tokenizer's separator)."""
    passages = read_table(args.passages, "passages")
    texts = passage_texts(passages, tokenizer.sep_token or "|")
    items, counts = build_training_queries(
        read_table(args.queries, "queries"),
        args.split,
        read_table(args.qrels, "qrels"),
        passages,
        read_table(args.negatives, "negatives"),
        read_table(extra_negatives, "negatives") if extra_negatives else None,
        read_table(teacher, "scores") if teacher else None,
    )
    check_pools(items, args.group_size)
    return items, counts, texts


def check_pools(items: list[TrainingQuery], group_size: int) -> int:
    """Count (and log) the queries whose negative pool is smaller than a group's ``group_size - 1``
    negatives: their groups repeat negatives. When no query's pool is large enough the group size
    is a mistake, not a shortage: an error. Returns the number of short queries."""
    need = group_size - 1
    short = [it for it in items if len(it.negatives) < need]
    if items and len(short) == len(items):
        largest = max(len(it.negatives) for it in items)
        raise StageError(
            f"--group-size {group_size} needs {need} negatives per query but no training query has that "
            f"many (largest pool: {largest}); lower the group size (finetune.retriever, finetune.reranker "
            f"or finetune.distill .group_size) to at most {largest + 1}, or deepen the pools "
            "(bm25.negatives_depth, finetune.mining_depth, finetune.reranker.depth, finetune.distill.candidates)"
        )
    if short:
        log.warning(
            "%d of %d training queries have fewer than %d negatives in their pool (smallest: %d): their "
            "groups of %d draw negatives with replacement, repeating some",
            len(short),
            len(items),
            need,
            min(len(it.negatives) for it in short),
            group_size,
        )
    return len(short)
