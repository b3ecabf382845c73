"""The training loop shared by every fine-tuning stage (retrievers, reranker, distillation).

One code path for CPU and GPU, one process or several (``torchrun``): AdamW with a linear
warm-up and decay, mixed precision on GPU (bf16 where supported, else fp16 with a scaler;
:mod:`dprflow.precision`), gradient accumulation, gradient checkpointing, clipping, batches built
in DataLoader workers when asked, a per-step log (``train_log.csv``, and TensorBoard events when
the package is installed), and resumable checkpoints.

Determinism and resume. Batches are a pure function of ``(seed, epoch, step)``: the order of the
training queries in an epoch comes from ``seed + epoch``, and each batch's sampling from a
generator seeded by ``(seed, global step)``. A checkpoint holds the model, the optimizer, the
schedule, the step and the torch random state (dropout), written every ``checkpoint_every``
steps to a folder that Snakemake does not manage (so it survives a failed job). A rerun that
finds a checkpoint made with the same arguments and the same input contents (the SHA-256 of every
input file or folder, as :mod:`dprflow.provenance` computes them) resumes at its step and, on the
CPU, ends with the same weights as a run that was never interrupted. A checkpoint made with other
arguments or from other data (a negatives file rewritten at the same path) is ignored, and the log
names what differs; it is never resumed.

A checkpoint is read with ``torch.load(weights_only=True)``: tensors and plain containers only,
so a results folder from elsewhere cannot run code on resume. A checkpoint that holds anything
else is refused with an error. A write that runs out of disk space is reported as such and leaves
no folder that looks finished (:func:`dprflow.data.schemas.disk_full_error`).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import logging
import math
import os
import pickle
import random
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dprflow import provenance
from dprflow.data.schemas import disk_full_error
from dprflow.precision import PRECISIONS, resolve_precision
from dprflow.precision import autocast as precision_autocast
from dprflow.progress import format_seconds
from dprflow.training import distributed
from dprflow.training.batches import StepBatches, count_tokens, split_rows, step_loader
from dprflow.training.tracking import EVENTS_DIR, EventLog

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "step-"
# Tests set this to a step number to have the process killed (SIGKILL) right after that step.
KILL_ENV = "DPRFLOW_KILL_AFTER_STEP"
# Beside COMPLETE: the identity's parts (arguments, input hashes), so a mismatch can say what changed.
IDENTITY_FILE = "identity.json"
# In the checkpoint folder, once a stage has succeeded: its final model folder (hard links, so no
# second copy on disk) with the identity it was trained under. A rerun of the stage with the same
# arguments and input contents (Snakemake reruns a job whose inputs were rewritten, e.g. after
# `finetune.encode_shards` changed) puts it back instead of training again.
FINISHED_DIR = "finished"


@dataclass
class TrainArgs:
    """Optimisation settings of one training stage."""

    batch_size: int = 8  # queries per optimizer step, over all processes
    learning_rate: float = 2e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    head_learning_rate: float = 0.0  # weights the model created at random (0: learning_rate)
    epochs: int = 1
    max_steps: int = 0  # > 0: exactly this many optimizer steps, whatever epochs says; 0: epochs
    stop_at_step: int = 0  # > 0: stop after this many steps of the schedule above (0: run it all)
    seed: int = 13
    checkpoint_every: int = 100
    max_grad_norm: float = 1.0  # 0: no clipping
    precision: str = "auto"  # auto (bf16/fp16 on GPU, fp32 on CPU), fp32, bf16, fp16
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step (see Trainer)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass
    num_workers: int = 0  # DataLoader worker processes that build the batches (0: this process)


@dataclass(kw_only=True)
class OptimArgs:
    """The command-line arguments every training stage shares (stages subclass it)."""

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
    checkpoint_every: int = field(default=100, metadata={"help": "steps between checkpoints"})
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto (bf16 where the GPU supports it, else fp16; fp32 on CPU), bf16, fp16, fp32",
            "choices": list(PRECISIONS),
        },
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the gradient norm (0: no clipping)"})
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={"help": "split each process's batch into this many micro-batches, one backward each"},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in the backward pass (less memory)"}
    )
    num_workers: int = field(
        default=0, metadata={"help": "DataLoader processes building the batches (0: the training process)"}
    )
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)"})


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


def fingerprint(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def autocast_context(device: torch.device, precision: str):
    """The autocast context of the training forward and the fp16 loss scaler (``None`` unless fp16)."""
    resolved = resolve_precision(precision, device)
    scaler = torch.amp.GradScaler("cuda") if resolved == "fp16" else None
    return precision_autocast(resolved, device), scaler


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    if not ckpt_dir.is_dir():
        return None
    done = [p for p in ckpt_dir.glob(CHECKPOINT_PREFIX + "*") if (p / "COMPLETE").exists()]
    return max(done, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]), default=None)


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


class Trainer:
    """Runs ``step_fn`` over batches with AdamW, a linear schedule, checkpoints and a loss log.

    ``make_batch(rng, items) -> batch`` turns the training items of one (local) batch into model
    inputs (``make_batch(rng, items, epoch)`` when it takes a third argument, the 0-based epoch); ``step_fn(model, batch) -> dict`` returns at least ``loss`` (a tensor to back-propagate)
    and any other scalars to log. ``save_fn(model, out_dir)`` writes a model folder.

    With ``manual_backward`` the step runs its own backward passes (a gradient cache does several):
    it is called as ``step_fn(model, batch, backward)`` and must call ``backward(tensor)``, which
    applies the fp16 loss scaling when there is one; its returned values are only logged.

    Gradient accumulation (``args.gradient_accumulation_steps = k``): the batch of a step is built
    as without accumulation, then cut into ``k`` micro-batches of ``B / k`` examples
    (:func:`~dprflow.training.batches.split_rows`); each runs its forward and a backward of
    ``loss / k``, and the optimizer steps once. The accumulated gradient is the mean of the
    micro-batch losses' gradients: the full batch's gradient when the loss is a mean of
    per-example terms (the reranker's list-wise loss, a contrastive loss over each query's own
    group). A loss that couples the examples of a batch is computed *per micro-batch* instead:
    a contrastive loss with in-batch negatives sees the ``B / k`` queries of its micro-batch and
    their passages only (fewer negatives), a token-mean loss averages per micro-batch, a MoCo
    queue is fed per micro-batch. Where the full batch's contrastive gradient is wanted, use the
    stage's gradient cache (``chunk_size``), exact with the memory of one chunk.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        items: Sequence[Any],
        make_batch: Callable[[np.random.Generator, list[Any]], Any],
        step_fn: Callable[[torch.nn.Module, Any], dict[str, torch.Tensor]],
        save_fn: Callable[[torch.nn.Module, Path], None],
        args: TrainArgs,
        checkpoint_dir: str | Path,
        identity: dict[str, Any],
        manual_backward: bool = False,
    ) -> None:
        self.dist = distributed.init_from_env()
        self.manual_backward = manual_backward
        self.args = args
        self.items = list(items)
        self.make_batch = make_batch
        self.step_fn = step_fn
        self.save_fn = save_fn
        self.checkpoint_dir = Path(checkpoint_dir)
        # How often checkpoints are written does not change what they hold: resumable across it.
        optim = {k: v for k, v in asdict(args).items() if k != "checkpoint_every"}
        self.identity_payload = {"identity": identity, "args": optim, "world": self.dist.world_size}
        self.identity = fingerprint(self.identity_payload)
        if args.batch_size % self.dist.world_size:
            raise ValueError(
                f"batch_size {args.batch_size} is not divisible by {self.dist.world_size} processes"
            )
        self.local_batch = args.batch_size // self.dist.world_size
        if args.gradient_accumulation_steps < 1 or self.local_batch % args.gradient_accumulation_steps:
            raise ValueError(
                f"gradient_accumulation_steps {args.gradient_accumulation_steps} must be >= 1 and divide "
                f"the batch of each process ({self.local_batch} = batch_size {args.batch_size} / "
                f"{self.dist.world_size} processes)"
            )
        # make_batch(rng, items, epoch) when it asks for the epoch (a sampler that must draw a
        # different candidate for an item in each epoch), else make_batch(rng, items).
        self.batches = StepBatches(
            self.items, make_batch, args.seed, args.batch_size, self.dist.rank, self.dist.world_size
        )
        # the learning-rate schedule spans schedule_steps; training stops after self.steps
        self.schedule_steps = total_steps(len(self.items), args)
        self.steps = steps_run(len(self.items), args)
        if args.gradient_checkpointing:
            enable = getattr(model, "gradient_checkpointing_enable", None)
            if enable is None:
                raise ValueError(f"gradient_checkpointing: {type(model).__name__} does not support it")
            # Non-reentrant checkpointing: gradients reach the weights although the inputs (token
            # ids) need none, and the recomputation replays the forward's dropout masks.
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            log.info("gradient checkpointing on")
        self.model = model.to(self.dist.device)
        self.optimizer = torch.optim.AdamW(parameter_groups(self.model, args), lr=args.learning_rate)
        warmup = int(self.schedule_steps * args.warmup_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: (
                (s + 1) / max(1, warmup)
                if s < warmup
                else max(0.0, (self.schedule_steps - s) / max(1, self.schedule_steps - warmup))
            ),
        )
        self.autocast, self.scaler = autocast_context(self.dist.device, args.precision)
        self.ddp_model = self.model
        if self.dist.world_size > 1:
            device_ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
            self.ddp_model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids)

    # -- checkpoints ------------------------------------------------------------------------
    def _save_checkpoint(self, step: int) -> None:
        if not self.dist.is_main:
            distributed.barrier()
            return
        final = self.checkpoint_dir / f"{CHECKPOINT_PREFIX}{step}"
        tmp = self.checkpoint_dir / f".tmp-{CHECKPOINT_PREFIX}{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = {
            "step": step,
            "identity": self.identity,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        try:
            self.save_fn(self.model, tmp / "model")
            torch.save(state, tmp / "trainer_state.pt")
            (tmp / IDENTITY_FILE).write_text(json.dumps(self.identity_payload, sort_keys=True, default=str))
            (tmp / "COMPLETE").write_text(self.identity)
        except (OSError, RuntimeError) as exc:
            full = disk_full_error(exc, tmp / "trainer_state.pt", state_bytes(state))
            shutil.rmtree(tmp, ignore_errors=True)
            if full is None:
                raise
            raise full from exc
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in self.checkpoint_dir.glob(CHECKPOINT_PREFIX + "*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint at step %d: %s", step, final)
        distributed.barrier()

    def _resume(self, load_fn: Callable[[torch.nn.Module, Path], None]) -> int:
        ckpt = latest_checkpoint(self.checkpoint_dir)
        if ckpt is None:
            return 0
        if (ckpt / "COMPLETE").read_text() != self.identity:
            log.warning(
                "ignoring checkpoint %s: it was made with other arguments or data (%s); training from step 0",
                ckpt,
                self._identity_difference(ckpt),
            )
            return 0
        try:
            state = torch.load(ckpt / "trainer_state.pt", map_location=self.dist.device, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ValueError(
                f"refusing to resume from {ckpt / 'trainer_state.pt'}: it holds objects other than tensors "
                f"and plain values, which loading would run as code ({str(exc).splitlines()[0]}); "
                f"delete {self.checkpoint_dir} to train from the start"
            ) from None
        load_fn(self.model, ckpt / "model")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        # map_location moved every tensor to the device; the generators take CPU byte tensors.
        torch.set_rng_state(state["torch_rng"].cpu())
        if state["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])
        log.info("resumed from %s at step %d of %d", ckpt, state["step"], self.steps)
        return int(state["step"])

    def _identity_difference(self, ckpt: Path) -> str:
        """What differs between a checkpoint's identity and this run's, for the log."""
        try:
            old = json.loads((ckpt / IDENTITY_FILE).read_text())
        except (OSError, ValueError):
            return "the checkpoint records no identity details"
        return (
            describe_difference(old, json.loads(json.dumps(self.identity_payload, default=str))) or "unknown"
        )

    # -- the loop ---------------------------------------------------------------------------
    def epoch_and_index(self, step: int) -> tuple[int, int]:
        """The epoch of global step ``step`` (0-based) and the step's place in it."""
        return self.batches.epoch_and_index(step)

    def local_items(self, step: int) -> list[Any]:
        """The items of this process's share of global step ``step`` (0-based)."""
        return self.batches.local_items(step)

    def train(self, load_fn: Callable[[torch.nn.Module, Path], None], log_path: str | Path) -> list[dict]:
        start = self._resume(load_fn)
        set_seed(self.args.seed) if start == 0 else None
        log_path = Path(log_path)
        history: list[dict] = []
        if start and log_path.exists():
            with open(log_path) as fh:
                history = [row for row in csv.DictReader(fh) if int(row["step"]) <= start]
        self.model.train()
        t0 = time.time()
        events = EventLog(log_path.parent, enabled=self.dist.is_main, start=start)
        # Every rank draws the whole global batch's randomness in the same order, then keeps
        # its share, so the sampling does not depend on the number of processes (StepBatches).
        loader = step_loader(
            self.batches, start, self.steps, self.args.num_workers, pin_memory=self.dist.device.type == "cuda"
        )
        tokens, step_start = 0, time.perf_counter()
        try:
            for step, batch in zip(range(start, self.steps), loader, strict=True):
                step_tokens = count_tokens(batch)
                out = self._accumulate(step, batch)
                grad_norm = self._optimizer_step()
                row = {"step": step + 1, "lr": self.scheduler.get_last_lr()[0]}
                row.update(self._mean_over_ranks(out))
                row["grad_norm"] = grad_norm
                history.append(row)
                now = time.perf_counter()
                tokens += step_tokens
                events.scalars(
                    step + 1,
                    {
                        **{f"train/{k}": v for k, v in row.items() if k != "step"},
                        "train/tokens_per_s": step_tokens / max(now - step_start, 1e-9),
                    },
                )
                step_start = now
                if (step + 1) % 10 == 0 or step + 1 == self.steps:
                    elapsed = max(1e-9, time.time() - t0)
                    rate = (step + 1 - start) / elapsed
                    log.info(
                        "step %d/%d loss %.4f (%.2f steps/s, %.0f tokens/s per process, elapsed %s, ETA %s)",
                        step + 1,
                        self.steps,
                        row["loss"],
                        rate,
                        tokens / elapsed,
                        format_seconds(elapsed),
                        format_seconds((self.steps - step - 1) / rate),
                    )
                if (step + 1) % self.args.checkpoint_every == 0 and step + 1 < self.steps:
                    self._write_log(history, log_path)
                    self._save_checkpoint(step + 1)
                if os.environ.get(KILL_ENV) == str(step + 1):
                    # Fault injection for the resume tests: die like `kill -9`, with no clean-up.
                    os.kill(os.getpid(), signal.SIGKILL)
        finally:
            events.close()
        self._write_log(history, log_path)
        return history

    def _optimizer_step(self) -> float:
        """Clip (``max_grad_norm``; 0 leaves the gradients as they are), step, zero the gradients;
        returns the gradient norm before clipping."""
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        # With no clipping the bound is infinite: the norm is measured, the gradients scaled by 1.
        bound = self.args.max_grad_norm or math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), bound)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _accumulate(self, step: int, batch: Any) -> dict[str, torch.Tensor]:
        """Forward and backward of one step's batch in ``gradient_accumulation_steps``
        micro-batches (class docstring); returns the logged values, averaged over them."""
        k = self.args.gradient_accumulation_steps
        no_sync = getattr(self.ddp_model, "no_sync", None)
        outs: list[dict[str, torch.Tensor]] = []
        for index, part in enumerate(split_rows(batch, k)):
            # DDP all-reduces the gradients once, in the backward of the last micro-batch.
            last = index == k - 1
            with contextlib.nullcontext() if (no_sync is None or last) else no_sync():
                with self.autocast:
                    if self.manual_backward:
                        out = self.step_fn(self.ddp_model, part, self._micro_backward)
                    else:
                        out = self.step_fn(self.ddp_model, part)
                loss = out["loss"]
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at step {step + 1}")
                if not self.manual_backward:
                    self._micro_backward(loss)
            outs.append(out)
        if k == 1:
            return outs[0]
        return {
            name: torch.stack([torch.as_tensor(o[name]).detach().float().reshape(()) for o in outs]).mean()
            for name in outs[0]
        }

    def _micro_backward(self, tensor: torch.Tensor) -> None:
        """Backward of one micro-batch's share, ``tensor / k`` (``tensor`` itself when k = 1)."""
        k = self.args.gradient_accumulation_steps
        self._backward(tensor / k if k > 1 else tensor)

    def _mean_over_ranks(self, out: dict[str, torch.Tensor]) -> dict[str, float]:
        """The logged scalars, averaged over processes: with equal local batches the mean of the
        ranks' losses is the full-batch loss, so the log reads the same for 1 or N processes."""
        keys = list(out)
        values = torch.stack([torch.as_tensor(out[k]).detach().float().reshape(()) for k in keys])
        if self.dist.world_size > 1:
            values = values.to(self.dist.device)
            torch.distributed.all_reduce(values)
            values /= self.dist.world_size
        return dict(zip(keys, values.tolist(), strict=True))

    def _backward(self, tensor: torch.Tensor) -> None:
        (self.scaler.scale(tensor) if self.scaler else tensor).backward()

    def _write_log(self, history: list[dict], path: Path) -> None:
        if not self.dist.is_main or not history:
            return
        keys = list(dict.fromkeys(k for row in history for k in row))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=keys)
                writer.writeheader()
                writer.writerows(history)
        except OSError as exc:
            full = disk_full_error(exc, tmp)
            tmp.unlink(missing_ok=True)
            if full is None:
                raise
            raise full from exc
        os.replace(tmp, path)

    def finish(self) -> None:
        """Remove the checkpoints once the final model is written (the job succeeded); the
        finished model's links (:data:`FINISHED_DIR`) stay."""
        if self.dist.is_main and self.checkpoint_dir.is_dir():
            for path in self.checkpoint_dir.iterdir():
                if path.name == FINISHED_DIR:
                    continue
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        distributed.cleanup()

    def reuse_finished(self, out: Path) -> bool:
        """Put back the model this stage finished with the same identity (arguments and input
        contents) as ``out``, instead of training again; ``False`` when there is none."""
        finished = self.checkpoint_dir / FINISHED_DIR
        if not (finished / "COMPLETE").is_file():
            return False
        if (finished / "COMPLETE").read_text() != self.identity:
            log.info(
                "not reusing the finished model in %s: it was made with other arguments or data (%s)",
                finished,
                self._identity_difference(finished),
            )
            return False
        if self.dist.is_main:
            tmp = out.parent / f".{out.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(finished / "model", tmp, copy_function=link_or_copy)
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
        log.info(
            "reused the model this stage finished with the same arguments and input contents (%s): "
            "no training; delete %s to train again",
            finished,
            finished,
        )
        return True

    def keep_finished(self, out: Path) -> None:
        """Link the final model folder ``out`` into the checkpoint folder with this run's identity."""
        if not self.dist.is_main:
            return
        finished = self.checkpoint_dir / FINISHED_DIR
        tmp = self.checkpoint_dir / f".{FINISHED_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(finished, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            shutil.copytree(out, tmp / "model", copy_function=link_or_copy)
            (tmp / IDENTITY_FILE).write_text(json.dumps(self.identity_payload, indent=1, default=str))
            (tmp / "COMPLETE").write_text(self.identity)
            tmp.rename(finished)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning(
                "could not keep the finished model in %s (%s): a rerun will train again", finished, exc
            )


def link_or_copy(src: str, dst: str) -> None:
    """A hard link where the file system allows one, else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: about what ``torch.save`` writes."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0


def describe_difference(old: Any, new: Any, where: str = "") -> str:
    """The leaves that differ between two JSON-like values, as ``key: old -> new``."""
    if isinstance(old, dict) and isinstance(new, dict):
        parts = [
            describe_difference(old.get(k), new.get(k), f"{where}.{k}" if where else str(k))
            for k in sorted(set(old) | set(new))
        ]
        return "; ".join(p for p in parts if p)
    if old == new:
        return ""
    return f"{where}: {old!r} -> {new!r}"


def mean_of(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan


# Stage arguments that describe where things go or how fast, not what is trained: they do not
# enter the checkpoint identity, so moving the output or changing threads, loader workers, the
# checkpoint interval or the job's memory still resumes.
NON_IDENTITY_ARGS = (
    "out",
    "checkpoint_dir",
    "threads",
    "training_queries",
    "mem_mb",
    "checkpoint_every",
    "num_workers",
)


def train_args_from(args: Any) -> TrainArgs:
    """The optimisation settings of a stage's argument dataclass (same field names)."""
    return TrainArgs(**{f: getattr(args, f) for f in TrainArgs.__dataclass_fields__ if hasattr(args, f)})


def train_and_save(
    model: torch.nn.Module,
    items: Sequence[Any],
    make_batch: Callable[[np.random.Generator, list[Any]], Any],
    step_fn: Callable[[torch.nn.Module, Any], dict[str, torch.Tensor]],
    model_class: Any,
    tokenizer: Any,
    stage_args: Any,
    extra_record: dict[str, Any],
    manual_backward: bool = False,
) -> None:
    """Train with checkpoints in ``stage_args.checkpoint_dir``, then write the final model folder
    ``stage_args.out`` atomically (model, tokenizer, ``training_args.json``, ``train_log.csv``)
    and remove the checkpoints, keeping links to the final model (:data:`FINISHED_DIR`): a rerun
    with the same arguments and input contents puts it back without training.
    ``model_class.from_pretrained`` reloads a checkpoint's model."""
    record = {k: v for k, v in asdict(stage_args).items() if k != "threads"}
    record.update(extra_record)

    def save(m: torch.nn.Module, out_dir: Path) -> None:
        m.save_pretrained(out_dir, tokenizer=tokenizer, extra=record)

    def load(m: torch.nn.Module, ckpt_dir: Path) -> None:
        m.load_state_dict(model_class.from_pretrained(ckpt_dir).state_dict())

    identity = {k: v for k, v in record.items() if k not in NON_IDENTITY_ARGS}
    # The content of every input (issue 18): a file rewritten at the same path is other data.
    identity["input_sha256"] = provenance.input_hashes(stage_args)
    checkpoint_dir = Path(stage_args.checkpoint_dir)
    trainer = Trainer(
        model,
        items,
        make_batch,
        step_fn,
        save,
        train_args_from(stage_args),
        checkpoint_dir,
        identity,
        manual_backward,
    )
    out = Path(stage_args.out)
    if trainer.reuse_finished(out):
        trainer.finish()
        return
    log_path = checkpoint_dir / "train_log.csv"
    trainer.train(load, log_path)
    tmp = out.parent / f".{out.name}.tmp"
    if trainer.dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            save(trainer.model, tmp)
            (tmp / "training_args.json").write_text(
                json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
            )
            shutil.copy(log_path, tmp / "train_log.csv")
            if (checkpoint_dir / EVENTS_DIR).is_dir():
                shutil.copytree(checkpoint_dir / EVENTS_DIR, tmp / EVENTS_DIR)
        except (OSError, RuntimeError) as exc:
            full = disk_full_error(exc, tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            if full is None:
                raise
            raise full from exc
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        trainer.keep_finished(out)
    trainer.finish()
