"""The fine-tuning pipeline the papers share (coCondenser §4.1, Condenser Appendix A.1).

- :mod:`.biencoder`: the bi-encoder retriever (shared or separate towers, CLS or mean pooling);
- :mod:`.cross_encoder`: the cross-encoder reranker;
- :mod:`.losses`: the contrastive loss over groups of one positive and negatives, the
  reranker's listwise loss, and distillation of the reranker into a retriever;
- :mod:`.examples`: training queries, their positives and negative pools, groups per step;
- :mod:`.reranking`: scoring and reordering a run with the cross-encoder.
- :mod:`.selection`: settings chosen on held-out training queries (the fusion: :mod:`dprflow.search.fusion`);
  :mod:`.grid_edges`: whether a choice lies at an edge of its grid.

Stages ``train_retriever`` (r1, r2, distill), ``train_reranker``, ``rerank``, ``score_candidates``.
"""
