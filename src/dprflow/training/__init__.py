"""Training machinery shared by every training stage.

- :mod:`.trainer`: the loop (``Trainer``: micro-batches, clipping, optimizer step, log,
  checkpoints) and ``train_and_save``;
- :mod:`.optim`: ``TrainArgs``, AdamW's parameter groups (fused on a GPU), warm-up and decay;
- :mod:`.speed`: mixed precision, TF32, the attention kernel, ``torch.compile`` of the layers,
  copies to the GPU, padding multiples: each decision a function of the device's properties
  (:class:`dprflow.hardware.DeviceInfo`), so the GPU branches are tested on a CPU;
- :mod:`.checkpoints`: checkpoints, resume, and the identity (arguments, inputs, code) that allows it;
- :mod:`.store`: the finished-model store (a rerun with the same arguments, inputs, code and
  stored bytes puts the final model back instead of training);
- :mod:`.batches`: the batches as a function of (seed, step), DataLoader workers, micro-batches;
- :mod:`.tracking`: ``train_log.csv``, TensorBoard event files (when tensorboard is installed),
  the logged values read back every ``log_every`` steps;
- :mod:`.memory`: the peak memory of a step, estimated before it runs;
- :mod:`.gradcache`: full-batch gradients of a contrastive loss in chunks (coCondenser §3.3);
- :mod:`.steps`: how a method's loss is stepped (whole, or with the gradient cache), the
  coCondenser step and the bi-encoder fine-tuning step;
- :mod:`.distributed`: process groups under torchrun and an exact gather with gradient.

Model modules never import these; the stages and the trainer call the models.
"""
