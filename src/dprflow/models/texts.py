"""The text an encoder reads for a passage: ``title [SEP] text``, or the text alone without a title.

Every stage that encodes or scores passages feeds them so (training, encoding the corpus,
reranking, doc2query), and a trained model's card tells its users to do the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def encoder_texts(passages: pd.DataFrame, sep_token: str) -> np.ndarray:
    """The text the encoders see of each passage: ``title [SEP] text`` (just the text without a title)."""
    titles = passages["title"].str.strip()
    return np.where(titles.eq(""), passages["text"], titles + f" {sep_token} " + passages["text"])


def passage_texts(passages: pd.DataFrame, sep_token: str) -> dict[str, str]:
    """Passage id -> :func:`encoder_texts` (a few passages: a run's candidates, a test's table)."""
    return dict(zip(passages["passage_id"], encoder_texts(passages, sep_token), strict=True))
