"""Condenser and coCondenser.

- :mod:`.model`: the Condenser (early/late backbone split, a head over the late [CLS] and the early
  tokens, two MLM losses: Condenser §3.3, eq. 4-11) and coCondenser's span-pair contrastive loss
  (coCondenser §3.2, eq. 6-7);
- :mod:`.data`: MLM chunks of the generic corpus (stage one) and span pairs of the collection's
  documents (stage two).

Stages ``pretrain_generic`` (Condenser) and ``pretrain_corpus`` (coCondenser, qac-coCondenser);
the gradient-cache step of §3.3 is :func:`dprflow.training.steps.cocondenser_gradcache_step`.
"""
