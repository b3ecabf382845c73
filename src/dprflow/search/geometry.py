"""The flags that override a bi-encoder's own pooling and similarity, for the stages that encode
with one (encode_corpus, search_dense: the queries must be encoded as the passages were)."""

from __future__ import annotations

from dataclasses import field


def geometry_field(what: str, choices: tuple[str, ...]):
    """An optional flag overriding the model's own pooling or similarity (encode and search)."""
    return field(
        default=None, metadata={"help": f"override the model's own {what}", "choices": list(choices)}
    )
