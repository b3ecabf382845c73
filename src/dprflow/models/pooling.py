"""Pooling: the token vectors of a text reduced to one vector, its embedding.

``cls`` takes the last layer's [CLS] vector (coCondenser eq. 13, CDMAE); ``mean`` the mean over
the real tokens (sentence-transformers' mean pooling, Contriever §3). The bi-encoder retriever
(:mod:`dprflow.finetuning.biencoder`) and Contriever's encoder
(:mod:`dprflow.pretraining.contriever.model`) pool with :func:`pool`; the settings a model folder
ships with are read by :mod:`dprflow.models.st_format`.
"""

from __future__ import annotations

import torch

from dprflow.models.st_format import POOLINGS, check_choice


def check_pooling(pooling: str) -> str:
    return check_choice(pooling, POOLINGS, "pooling")


def pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Reduce token vectors to one vector per text.

    Args:
        last_hidden: ``[B, L, H]`` last-layer hidden states.
        attention_mask: ``[B, L]``, 1 for real tokens and 0 for padding.
        pooling: ``"cls"``, the vector at position 0 (the [CLS] token); or ``"mean"``, the mean
            over real tokens (special tokens included, padding excluded; sentence-transformers'
            mean pooling).

    Returns:
        ``[B, H]``.
    """
    check_pooling(pooling)
    if pooling == "cls":
        return last_hidden[:, 0]
    mask = attention_mask.to(last_hidden.dtype).unsqueeze(-1)  # [B, L, 1]
    return (last_hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
