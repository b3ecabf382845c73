"""BERT's masked language model, pre-trained from random weights: the MLM base.

- :mod:`.model`: a BERT encoder with its MLM prediction head and the masked-token loss (Devlin et
  al. 2019, section 3.1, "Task #1: Masked LM"), built from a small config (:class:`.model.MLMConfig`),
  and the held-out masked-token loss and accuracy.

Stage ``pretrain_mlm``: the model ``model.init: mlm`` names, every method's starting model (the
papers start from BERT, a language model that never saw a retrieval objective). The masking
(15% of the tokens selected; of those 80% [MASK], 10% a random token, 10% kept) is
:mod:`dprflow.pretraining.masking`; the batches are :func:`dprflow.pretraining.condenser.data.mlm_batch`'s
``[CLS] chunk [SEP]`` rows of the generic corpus.
"""

# A sequence is a chunk of at least this many tokens: a document's shorter tail is dropped.
MIN_SEQUENCE_TOKENS = 8


def sequences_of(tokens: int, max_length: int) -> int:
    """How many sequences the MLM base cuts from a document of ``tokens`` tokens: consecutive
    chunks of ``max_length - 2`` tokens (``[CLS]`` and ``[SEP]`` make ``max_length``), each kept
    when it holds at least :data:`MIN_SEQUENCE_TOKENS` (the count of
    :func:`dprflow.data.token_store.chunk_ranges`, without a token store). It never falls as
    ``tokens`` grows, so a bound on the tokens bounds the sequences."""
    length = max_length - 2
    full = tokens // length if length >= MIN_SEQUENCE_TOKENS else 0
    return full + (tokens % length >= MIN_SEQUENCE_TOKENS)
