"""Command-line argument fields that several stages share, each declared once.

A training stage's argument dataclass subclasses :class:`TrainArgs`, which is also what the
:class:`~dprflow.training.trainer.Trainer` takes. It is made of three parts:

- :class:`OptimArgs`: the optimizer and its schedule (each method's config section sets them);
- :class:`TrainingSettings`: the config's ``training`` section, one field per key of
  ``config/schema.yaml`` (``tests/test_training_settings.py`` holds them equal, names and
  defaults, and checks that each key set in a config reaches every training stage; the rules
  build these flags from the schema's keys, :func:`dprflow.rule_flags.training_flags`);
- :class:`JobArgs`: what the job was given (threads, memory), never what is trained.

It lives beside :mod:`dprflow.cli`, not in the training machinery, so that argument dataclasses
in method folders (``finetuning/examples.py``) import no trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dprflow.precision import PRECISIONS

ATTENTIONS = ("sdpa", "eager", "flash_attention_2", "packed")


@dataclass(kw_only=True)
class OptimArgs:
    """AdamW, its learning-rate schedule and the step budget."""

    batch_size: int = field(default=8, metadata={"help": "examples per optimizer step (all processes)"})
    learning_rate: float = field(default=2e-5, metadata={"help": "AdamW peak learning rate"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    warmup_ratio: float = field(default=0.1, metadata={"help": "linear warm-up share"})
    head_learning_rate: float = field(
        default=0.0,
        metadata={
            "help": "peak learning rate of weights initialised at random (a new classification head); "
            "0: learning_rate"
        },
    )
    epochs: int = field(default=1, metadata={"help": "passes over the training examples"})
    max_steps: int = field(
        default=0,
        metadata={
            "help": "train exactly this many optimizer steps, cycling over the examples as often as "
            "needed and ignoring --epochs (as Hugging Face's max_steps); 0: --epochs passes"
        },
    )
    stop_at_step: int = field(
        default=0,
        metadata={
            "help": "stop after this many optimizer steps while the learning-rate schedule spans "
            "--epochs / --max-steps (CDMAE Appendix A: 20 epochs, the checkpoint at 80k); 0: run the whole schedule"
        },
    )
    seed: int = field(default=13, metadata={"help": "random seed"})


@dataclass(kw_only=True)
class TrainingSettings:
    """The config's ``training`` section, key for key (its descriptions: config/schema.yaml). Each
    is a memory or speed setting: none changes the math beyond float rounding, except where the
    schema says so (gradient accumulation with in-batch negatives, padding and dropout)."""

    gradient_accumulation_steps: int = field(
        default=1,
        metadata={"help": "split each process's batch into this many micro-batches, one backward each"},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in the backward pass (less memory)"}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the gradient norm (0: no clipping)"})
    num_workers: int = field(
        default=0, metadata={"help": "DataLoader processes building the batches (0: the training process)"}
    )
    fused_adamw: bool = field(
        default=True, metadata={"help": "AdamW's fused kernel on a GPU (one kernel for all weights)"}
    )
    tf32: bool = field(
        default=True, metadata={"help": "TF32 tensor cores for the fp32 matrix products on a GPU"}
    )
    compile: bool = field(
        default=False, metadata={"help": "torch.compile the Transformers (warm-up of a minute or more)"}
    )
    attention: str = field(
        default="sdpa",
        metadata={
            "help": "attention kernel of the Transformers: sdpa (torch's fused attention), eager, "
            "flash_attention_2 (needs the flash-attn package), packed (the retriever's and the "
            "Condenser's steps over real tokens only, no attention dropout; docs/training.md)",
            "choices": list(ATTENTIONS),
        },
    )
    log_every: int = field(
        default=10,
        metadata={"help": "read the logged values back from the device every N steps (one host sync)"},
    )
    chunk_from_memory: bool = field(
        default=True,
        metadata={
            "help": "with a gradient cache on a GPU, encode the largest chunk that fits in the device's "
            "memory (at least --chunk-size)"
        },
    )
    # A string on the command line ("auto" or digits); dprflow.training.speed.pad_multiple reads it.
    pad_to_multiple_of: str | int = field(
        default="auto",
        metadata={
            "help": "pad each batch's sequences to a multiple of this at their longest (0: the longest; "
            "auto: 8 on a GPU, 0 on a CPU)"
        },
    )
    pretokenize: bool = field(
        default=True,
        metadata={
            "help": "retriever and reranker: build batches from token ids made once before training "
            "instead of tokenizing each batch's texts (the same batches)"
        },
    )


@dataclass(kw_only=True)
class JobArgs:
    """What the job was given (the rule's resources): how fast it runs, not what it trains."""

    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)"})
    mem_mb: int = field(
        default=0,
        metadata={"help": "memory the job was given in MB (the rule's resources.mem_mb; 0: the machine's)"},
    )


@dataclass(kw_only=True)
class TrainArgs(OptimArgs, TrainingSettings, JobArgs):
    """Everything a training stage and its Trainer share (a stage's ``Args`` subclasses it)."""

    precision: str = field(
        default="auto",
        metadata={
            "help": "auto (bf16 where the GPU supports it, else fp16; fp32 on CPU), bf16, fp16, fp32",
            "choices": list(PRECISIONS),
        },
    )
    checkpoint_every: int = field(default=100, metadata={"help": "steps between checkpoints"})
