"""Training machinery shared by every training stage.

- :mod:`.trainer`: the Trainer (AdamW, warm-up and linear decay, batches fixed by seed and step,
  resumable checkpoints, mixed precision) and ``train_and_save``;
- :mod:`.store`: the finished-model store (a rerun with the same arguments, inputs, code and
  stored bytes puts the final model back instead of training);
- :mod:`.batches`: the batches as a function of (seed, step), DataLoader workers, micro-batches;
- :mod:`.tracking`: TensorBoard event files beside ``train_log.csv`` (when tensorboard is installed);
- :mod:`.gradcache`: full-batch gradients of a contrastive loss in chunks (coCondenser §3.3);
- :mod:`.steps`: how a method's loss is stepped (whole, or with the gradient cache), the
  coCondenser step and the bi-encoder fine-tuning step;
- :mod:`.distributed`: process groups under torchrun and an exact gather with gradient.

Model modules never import these; the stages and the trainer call the models.
"""
