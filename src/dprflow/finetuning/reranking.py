"""Cross-encoder scoring of (query, passage) pairs, and reranking a run with it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from dprflow.hardware import stage_device
from dprflow.precision import autocast, resolve_precision
from dprflow.progress import Progress

log = logging.getLogger(__name__)


# A (query, passage) pair is cut to max_length tokens by taking tokens off the longer side first
# ("longest_first", the truncation of sentence-transformers' CrossEncoder): a query shorter than
# the cut passage, the usual case, stays whole, and a query longer than the whole budget (CISI has
# queries of over 200 tokens) is cut as well, where cutting only the passage cannot fit the pair.
PAIR_TRUNCATION = "longest_first"


def tokenize_pairs(tokenizer, queries: Sequence[str], passages: Sequence[str], max_length: int):
    """The padded batch of (query, passage) pairs a cross-encoder reads (PyTorch tensors)."""
    return tokenizer(
        list(queries),
        list(passages),
        max_length=max_length,
        truncation=PAIR_TRUNCATION,
        padding=True,
        return_tensors="pt",
    )


def score_pairs(
    model,
    tokenizer,
    queries: Sequence[str],
    passages: Sequence[str],
    max_length: int,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
) -> np.ndarray:
    """Scores of (query, passage) pairs, in input order; pairs are batched by length (less padding).

    ``precision`` (a resolved one: ``fp32``, ``bf16``, ``fp16``) runs the forward under
    ``torch.autocast``; the scores are float32 either way."""
    order = np.argsort([-(len(q) + len(p)) for q, p in zip(queries, passages, strict=True)], kind="stable")
    out = np.empty(len(order), dtype=np.float32)
    model.eval()
    progress = Progress(log, "scored", len(order), unit="pairs")
    with torch.inference_mode(), autocast(precision, device):
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            enc = tokenize_pairs(
                tokenizer, [queries[i] for i in idx], [passages[i] for i in idx], max_length
            ).to(device)
            out[idx] = model(**enc).float().cpu().numpy()
            progress.update(len(idx))
    return out


def score_with_reranker(
    model_dir: str,
    query_text: pd.Series,
    passages: pd.DataFrame,
    pairs: pd.DataFrame,
    max_length: int,
    batch_size: int = 64,
    precision: str = "auto",
) -> np.ndarray:
    """Load a reranker folder and score ``pairs`` (query_id, passage_id); ``query_text`` maps id -> text.

    ``precision``: the setting (``auto``, ``bf16``, ``fp16``, ``fp32``), resolved for the device
    (:func:`dprflow.precision.resolve_precision`)."""
    from dprflow.finetuning.biencoder import load_tokenizer
    from dprflow.finetuning.cross_encoder import CrossEncoder
    from dprflow.models.texts import passage_texts

    tokenizer = load_tokenizer(model_dir)
    texts = passage_texts(passages, tokenizer.sep_token or "|")
    device = stage_device()
    model = CrossEncoder.from_pretrained(model_dir).to(device)
    resolved = resolve_precision(precision, device)
    log.info("scoring in %s on %s", resolved, device)
    return score_pairs(
        model,
        tokenizer,
        pairs["query_id"].map(query_text).tolist(),
        [texts[p] for p in pairs["passage_id"]],
        max_length,
        batch_size,
        device,
        resolved,
    )


def rerank_run(run: pd.DataFrame, scores: np.ndarray, depth: int) -> pd.DataFrame:
    """Replace the top-``depth`` order of each query by ``scores`` (given for those rows, in run order).

    Passages below ``depth`` keep their order after the reranked ones, so the run keeps its depth
    and recall at large cut-offs stays comparable; their scores are shifted below the reranked ones.
    """
    top = run[run["rank"] <= depth].copy()
    top["score"] = scores.astype(np.float32)
    top = top.sort_values(["query_id", "score", "passage_id"], ascending=[True, False, True], kind="stable")
    rest = run[run["rank"] > depth].copy()
    if len(rest):
        floor = top.groupby("query_id")["score"].min()
        shift = rest["query_id"].map(floor).fillna(0.0) - 1.0 - rest["rank"] * 1e-3
        rest["score"] = shift.astype(np.float32)
    out = pd.concat([top, rest]).sort_values(["query_id", "score"], ascending=[True, False], kind="stable")
    out["rank"] = (out.groupby("query_id").cumcount() + 1).astype(np.int32)
    return out[["query_id", "passage_id", "score", "rank"]].reset_index(drop=True)
