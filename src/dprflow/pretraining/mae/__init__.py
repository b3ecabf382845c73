"""Bottlenecked masked auto-encoders: BMAE, CDMAE and CoT-MAE.

- :mod:`.model`: the encoder, the shallow decoder that sees only the encoder's [CLS] (the
  bottleneck) and its masked tokens, and the two MLM losses (CDMAE §3.1, eq. 1-5);
- :mod:`.data`: the batches: random decoder masking (BMAE), importance-aware decoder masking
  (CDMAE §3.2), sentence spans of one document each encoded once and decoded once from the
  other's [CLS] (CoT-MAE);
- :mod:`.pmi`: n-gram counts of the corpus and their PMI (CDMAE §3.2, eq. 6-7);
- :mod:`.importance_masking`: token importance as the mutual information it carries (AMI, eq. 8)
  and masking by it.

Stages ``pmi_count``, ``pmi``, ``pretrain_mae_generic``, ``pretrain_mae_corpus`` (module
``pretrain_mae``).
"""
