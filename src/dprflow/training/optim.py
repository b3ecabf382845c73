"""AdamW with a linear warm-up and decay, read from a stage's :class:`~dprflow.stage_args.TrainArgs`.

No weight decay for biases and LayerNorm; weights a loader created at random may get their own
peak learning rate; AdamW runs its fused kernel on a GPU when ``fused_adamw`` is set (the update
is the same to float rounding; ``tests/test_training_speed.py``).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

from dprflow.stage_args import TrainArgs

# Stage arguments that describe where things go or how fast, not what is trained: they do not
# enter the checkpoint identity, so moving the output or changing threads, loader workers, the
# checkpoint interval, the job's memory, how often the loss is read or whether the texts are
# tokenized per batch or once (the same batches) still resumes.
NON_IDENTITY_ARGS = (
    "out",
    "checkpoint_dir",
    "threads",
    "training_queries",
    "mem_mb",
    "checkpoint_every",
    "num_workers",
    "log_every",
    "pretokenize",
)


def train_args_from(args: TrainArgs) -> TrainArgs:
    """The :class:`TrainArgs` part of a stage's arguments (a subclass of it), as the Trainer takes."""
    return TrainArgs(**{f.name: getattr(args, f.name) for f in fields(TrainArgs)})


def total_steps(n_items: int, args: TrainArgs) -> int:
    """Optimizer steps of a stage: ``max_steps`` when set (a step budget: the examples are
    cycled over in as many epochs as it takes, each in a new order, as Hugging Face's
    ``max_steps``), else ``epochs`` passes of ``n_items // batch_size`` steps."""
    per_epoch = n_items // args.batch_size
    if per_epoch == 0:
        raise ValueError(f"{n_items} training queries are fewer than one batch of {args.batch_size}")
    return args.max_steps if args.max_steps else per_epoch * args.epochs


def steps_run(n_items: int, args: TrainArgs) -> int:
    """Optimizer steps a stage runs: its schedule's :func:`total_steps`, cut at ``stop_at_step``."""
    steps = total_steps(n_items, args)
    return min(steps, args.stop_at_step) if args.stop_at_step else steps


def parameter_groups(model: torch.nn.Module, args: TrainArgs) -> list[dict[str, Any]]:
    """AdamW groups: no weight decay for biases and LayerNorm; with ``args.head_learning_rate``,
    the weights named in ``model.new_parameter_names`` (those a loader initialised at random,
    such as a cross-encoder's classification head) get their own peak learning rate. A random
    head under the encoder's small fine-tuning rate barely moves in a short run; a larger rate
    for the head alone lets it learn while the pre-trained weights stay close to their start."""
    new_names = set(getattr(model, "new_parameter_names", ()) or ()) if args.head_learning_rate else set()
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = param.ndim < 2 or "LayerNorm" in name or "bias" in name
        groups.setdefault((name in new_names, no_decay), []).append(param)
    unknown = new_names - {n for n, _ in model.named_parameters()}
    if unknown:
        raise ValueError(f"new_parameter_names not in the model: {sorted(unknown)}")
    out = []
    for (is_new, no_decay), params in sorted(groups.items()):
        group: dict[str, Any] = {"params": params, "weight_decay": 0.0 if no_decay else args.weight_decay}
        if is_new:
            group["lr"] = args.head_learning_rate
        out.append(group)
    return out


def adamw(model: torch.nn.Module, args: TrainArgs, fused: bool) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups`; ``fused``: torch's single-kernel implementation."""
    return torch.optim.AdamW(parameter_groups(model, args), lr=args.learning_rate, fused=fused or None)


def linear_schedule(optimizer: torch.optim.Optimizer, steps: int, warmup_ratio: float):
    """Linear warm-up over ``warmup_ratio`` of ``steps``, then linear decay to 0."""
    warmup = int(steps * warmup_ratio)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / max(1, warmup) if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup)),
    )
