"""Query-as-context pre-training: a passage and a query generated from it as a pair.

- :mod:`.doc2query`: a query generator (any seq2seq checkpoint, or BERT2BERT trained on the
  training pairs) and nucleus sampling of C queries per passage (query-as-context §3.1);
- :mod:`.pairs`: the (passage, query) pairs of each epoch, for qac-coCondenser (the contrastive
  pair) and qac-CoT-MAE (the decoder's context), query-as-context §3.2.

Stages ``train_doc2query`` and ``doc2query``; the pre-training itself runs in
``pretrain_corpus`` and ``pretrain_mae_corpus``.
"""
