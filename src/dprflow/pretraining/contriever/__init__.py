"""Contriever: contrastive pre-training on independent random crops (Contriever §3).

- :mod:`.model`: the query encoder, the MoCo momentum key encoder and queue, and the InfoNCE
  loss (§3.1, in-batch or MoCo negatives);
- :mod:`.data`: the pairs the loss sees: random crops with token deletion (§3.2, Appendix A) or
  inverse cloze pairs.

Stage ``pretrain_contriever``. :func:`longest_view` is here, with no imports, because the config
check (read when the DAG is built) bounds the same views without loading torch.
"""


def longest_view(pairs: str, ratio_max: float, max_doc_tokens: int) -> int:
    """The most tokens a view holds, [CLS] and [SEP] left out: a crop is at most ``ratio_max`` of
    the window (``data.span_length``), an ICT context the window less its span (at most the whole
    window, when the span is kept). The model's positions must hold this plus 2, not the window."""
    if pairs == "ict":
        return max_doc_tokens
    return max(1, int(ratio_max * max_doc_tokens))
