"""Contriever: contrastive pre-training on independent random crops (Contriever §3).

- :mod:`.model`: the query encoder, the MoCo momentum key encoder and queue, and the InfoNCE
  loss (§3.1, in-batch or MoCo negatives);
- :mod:`.data`: the pairs the loss sees: random crops with token deletion (§3.2, Appendix A) or
  inverse cloze pairs.

Stage ``pretrain_contriever``.
"""
