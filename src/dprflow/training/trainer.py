"""The training loop shared by every training stage (pre-training, doc2query, retrievers, reranker).

One code path for CPU and GPU, one process or several (``torchrun``): AdamW with a linear warm-up
and decay (:mod:`.optim`), mixed precision and the speed switches (:mod:`.speed`), gradient
accumulation, gradient checkpointing, clipping, batches built in DataLoader workers when asked
(:mod:`.batches`), a per-step log (``train_log.csv`` and TensorBoard events, :mod:`.tracking`),
resumable checkpoints (:mod:`.checkpoints`) and the finished-model store (:mod:`.store`).

A graceful stop. SIGTERM (what Slurm sends at a job's time limit, a grace period before its kill)
or SIGUSR1 (``sbatch --signal``) only records that a stop was asked (:class:`StopRequest`); at the
next step boundary the stage saves a checkpoint of that step and exits with its error code (1),
saying so: the rerun resumes from that step instead of the last ``checkpoint_every`` one.

Determinism and resume. Batches are a pure function of ``(seed, epoch, step)``: the order of the
training queries in an epoch comes from ``seed + epoch``, and each batch's sampling from a
generator seeded by ``(seed, global step)``. A rerun that finds a checkpoint of the same identity
(arguments, input contents, code) resumes at its step and, on the CPU, ends with the same weights
as a run that was never interrupted (docs/resuming.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dprflow import hardware, provenance
from dprflow.errors import StageError
from dprflow.progress import format_seconds
from dprflow.stage_args import TrainArgs
from dprflow.training import distributed, memory, steps
from dprflow.training.batches import StepBatches, count_tokens, split_rows, step_loader
from dprflow.training.checkpoints import Checkpoints, state_bytes
from dprflow.training.optim import (
    NON_IDENTITY_ARGS,
    adamw,
    linear_schedule,
    parameter_groups,  # noqa: F401 (imported from here by tests)
    steps_run,
    total_steps,
    train_args_from,
)
from dprflow.training.speed import (
    autocast_context,
    compile_transformers,
    cuda_rng_state,
    ddp_device_ids,
    pad_multiple,
    pin_memory,
    restore_cuda_rng,
    set_attention,
    set_seed,
    set_tf32,
    tf32_applies,
    to_device,
    use_fused_adamw,
)
from dprflow.training.store import FINISHED_DIR, FinishedStore
from dprflow.training.tracking import EVENTS_DIR, EventLog, StepLog, write_log

log = logging.getLogger(__name__)

# Tests set this to a step number to have the process killed (SIGKILL) right after that step, or
# to "<step>:<signal name>" (e.g. "7:SIGTERM") to have that signal sent to it there instead.
KILL_ENV = "DPRFLOW_KILL_AFTER_STEP"

# The signals that ask a training stage to stop at the next step boundary: Slurm's SIGTERM before
# its kill at the time limit, and the SIGUSR1 that `sbatch --signal=USR1@<seconds>` sends earlier.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """While entered, :data:`STOP_SIGNALS` only record that a stop was asked (``signum``, 0 while
    none was); the handlers they had before are put back on exit. Python lets only the main thread
    install handlers: in another thread this changes nothing and ``signum`` stays 0."""

    def __init__(self) -> None:
        self.signum = 0
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._record) for sig in STOP_SIGNALS}
        return self

    def _record(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            # None: a handler installed outside Python, which cannot be put back; the default then.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self.previous = {}


class StoppedBySignal(StageError):
    """The run stopped on a signal after writing a checkpoint at ``step``: an error of the stage,
    so the job fails (exit code 1) without an output or a provenance record, and a rerun resumes."""

    def __init__(self, signum: int, step: int, steps: int, checkpoint: Path) -> None:
        self.signum, self.step = signum, step
        super().__init__(
            f"stopped on signal {signal.Signals(signum).name} ({signum}) at step {step} of {steps}: "
            f"checkpoint {checkpoint} written; rerun the job to resume from step {step}"
        )


class Trainer:
    """Runs ``step_fn`` over batches with AdamW, a linear schedule, checkpoints and a loss log.

    ``make_batch(rng, items) -> batch`` turns the training items of one (local) batch into model
    inputs (``make_batch(rng, items, epoch)`` when it takes a third argument, the 0-based epoch);
    ``step_fn(model, batch) -> dict`` returns at least ``loss`` (a tensor to back-propagate) and
    any other scalars to log. ``save_fn(model, out_dir)`` writes a model folder.

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
        pad_id: int = 0,
    ) -> None:
        self.dist = distributed.init_from_env()
        # What the GPU-only decisions read (dprflow.hardware); tensors go to self.dist.device.
        self.device_info = hardware.device_info(self.dist.device)
        self.manual_backward = manual_backward
        self.args = args
        # A Sequence (e.g. a token store's lazy ranges) is kept as it is: never copied to a list.
        self.items = items if isinstance(items, Sequence) else list(items)
        self.step_fn = step_fn
        self.save_fn = save_fn
        self.checkpoint_dir = Path(checkpoint_dir)
        # How often checkpoints are written or the loss read does not change what they hold.
        optim = {k: v for k, v in asdict(args).items() if k not in NON_IDENTITY_ARGS}
        payload = {"identity": identity, "args": optim, "world": self.dist.world_size}
        self.checkpoints = Checkpoints(self.checkpoint_dir, payload)
        self.identity, self.identity_payload = self.checkpoints.identity, payload
        self.store = FinishedStore(self.checkpoint_dir / FINISHED_DIR, self.identity, payload)
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
        # Each batch padded to a multiple of pad_multiple (input ids with pad_id): a few shapes.
        self.pad_multiple = pad_multiple(args.pad_to_multiple_of, self.device_info)
        self.batches = StepBatches(
            self.items,
            make_batch,
            args.seed,
            args.batch_size,
            self.dist.rank,
            self.dist.world_size,
            self.pad_multiple,
            pad_id,
        )
        # the learning-rate schedule spans schedule_steps; training stops after self.steps
        self.schedule_steps = total_steps(len(self.items), args)
        self.steps = steps_run(len(self.items), args)
        self.model = self._prepare(model)
        info = self.device_info
        self.optimizer = adamw(self.model, args, fused=use_fused_adamw(info, args.fused_adamw))
        self.scheduler = linear_schedule(self.optimizer, self.schedule_steps, args.warmup_ratio)
        self.precision, self.autocast, self.scaler = autocast_context(self.dist.device, args.precision, info)
        self.ddp_model, self.stop_group = self.model, None
        if self.dist.world_size > 1:
            self.ddp_model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=ddp_device_ids(self.dist.device)
            )
            # The ranks' stop requests are combined on the CPU (gloo), so the check after each
            # step never waits for the GPU; with NCCL that needs a gloo group of its own.
            if torch.distributed.get_backend() != "gloo":
                self.stop_group = torch.distributed.new_group(backend="gloo")
        self._log_device()

    def _log_device(self) -> None:
        """One line with the device's properties and what the run decided from them."""
        info = self.device_info
        budget = "none" if self.chunk_budget is None else f"{self.chunk_budget // memory.MB} MB"
        log.info(
            "device %s, %s: %s, fused AdamW %s, TF32 %s, pinned batches %s, gradient-cache budget %s, "
            "batches padded to a multiple of %d",
            self.dist.device,
            info.describe(),
            self.precision,
            self.optimizer.defaults.get("fused") or False,
            tf32_applies(info) and self.args.tf32,
            pin_memory(info),
            budget,
            self.pad_multiple,
        )

    def _prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model on its device with the configured kernels (:mod:`.speed`)."""
        args, device = self.args, self.dist.device
        if args.gradient_checkpointing:
            enable = getattr(model, "gradient_checkpointing_enable", None)
            if enable is None:
                raise ValueError(f"gradient_checkpointing: {type(model).__name__} does not support it")
            # Non-reentrant checkpointing: gradients reach the weights although the inputs (token
            # ids) need none, and the recomputation replays the forward's dropout masks.
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            log.info("gradient checkpointing on")
        # packed steps: each batch carries its packing, made on the host as the batch is built
        self.batches.packed = set_attention(model, args.attention)
        set_tf32(self.device_info, args.tf32)
        model = model.to(device)
        if args.compile:
            compile_transformers(model)
        # What one gradient-cache chunk's activations may take on a GPU: 90% of its memory less
        # the weights, gradients and AdamW moments (training/memory.py); None on a CPU.
        self.chunk_budget = (
            memory.gradient_cache_budget(self.device_info, model) if args.chunk_from_memory else None
        )
        return model

    # -- the loop ---------------------------------------------------------------------------
    def train(self, load_fn: Callable[[torch.nn.Module, Path], None], log_path: str | Path) -> list[dict]:
        start = self._resume(load_fn)
        set_seed(self.args.seed) if start == 0 else None
        log_path = Path(log_path)
        history = self._history_until(log_path, start)
        self.model.train()
        events = EventLog(log_path.parent, enabled=self.dist.is_main, start=start)
        step_log = StepLog(history, events, self.args.log_every)
        # Every rank draws the whole global batch's randomness in the same order, then keeps
        # its share, so the sampling does not depend on the number of processes (StepBatches).
        pinned = pin_memory(self.device_info)
        loader = step_loader(self.batches, start, self.steps, self.args.num_workers, pin_memory=pinned)
        self.t0, self.tokens, step_start = time.time(), 0, time.perf_counter()
        with StopRequest() as stop_request, contextlib.closing(events):
            for step, batch in zip(range(start, self.steps), loader, strict=True):
                step_tokens = count_tokens(batch)  # on the host, before the copy: no device sync
                batch = to_device(batch, self.dist.device)
                with steps.chunk_budget(self.chunk_budget):
                    out = self._accumulate(batch)
                out["grad_norm"] = self._optimizer_step()
                now, self.tokens = time.perf_counter(), self.tokens + step_tokens
                lr = self.scheduler.get_last_lr()[0]
                rows = step_log.add(step + 1, lr, self._mean_over_ranks(out), step_tokens, now - step_start)
                self._report(rows, start)
                step_start = now
                last = step + 1 == self.steps
                # A stop signal asks for a checkpoint of this step and an exit; the last step just ends.
                stop = 0 if last else self._stop_signal(stop_request)
                if not last and (stop or (step + 1) % self.args.checkpoint_every == 0):
                    self._report(step_log.flush(), start)
                    self._save_checkpoint(step + 1, history, log_path)
                if stop:
                    raise StoppedBySignal(stop, step + 1, self.steps, self.checkpoints.path(step + 1))
                at, _, name = os.environ.get(KILL_ENV, "").partition(":")
                if at == str(step + 1):
                    # Fault injection for the resume tests: die like `kill -9`, with no clean-up,
                    # or receive the named signal (the graceful stop's, seen at the next boundary).
                    os.kill(os.getpid(), getattr(signal, name or "SIGKILL"))
            self._report(step_log.flush(), start)
        if self.dist.is_main:
            write_log(history, log_path)
        return history

    def _accumulate(self, batch: Any) -> dict[str, torch.Tensor]:
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
                if not self.manual_backward:
                    self._micro_backward(out["loss"])
            outs.append(out)
        if k == 1:
            return dict(outs[0])
        return {
            name: torch.stack([torch.as_tensor(o[name]).detach().float().reshape(()) for o in outs]).mean()
            for name in outs[0]
        }

    def _optimizer_step(self) -> torch.Tensor:
        """Clip (``max_grad_norm``; 0 leaves the gradients as they are), step, zero the gradients;
        returns the gradient norm before clipping (a tensor: reading it would wait for the GPU)."""
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
        return norm

    def _micro_backward(self, tensor: torch.Tensor) -> None:
        """Backward of one micro-batch's share, ``tensor / k`` (``tensor`` itself when k = 1)."""
        k = self.args.gradient_accumulation_steps
        tensor = tensor / k if k > 1 else tensor
        (self.scaler.scale(tensor) if self.scaler else tensor).backward()

    def _mean_over_ranks(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The logged scalars, averaged over processes: with equal local batches the mean of the
        ranks' losses is the full-batch loss, so the log reads the same for 1 or N processes."""
        if self.dist.world_size == 1:
            return out
        keys = list(out)
        values = torch.stack([torch.as_tensor(out[k]).detach().float().reshape(()) for k in keys])
        values = values.to(self.dist.device)
        torch.distributed.all_reduce(values)
        values /= self.dist.world_size
        return dict(zip(keys, values, strict=True))

    def _stop_signal(self, request: StopRequest) -> int:
        """The signal that asked this run to stop (0: none), the same on every process: with
        several, a signal any of them got stops them all after the same step (an ``all_reduce``
        MAX of the signal numbers, one integer on the CPU); one process runs no collective."""
        if self.dist.world_size == 1:
            return request.signum
        flag = torch.tensor([request.signum], dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.stop_group)
        return int(flag.item())

    def _report(self, rows: list[dict], start: int) -> None:
        """The progress line every 10 steps and at the last, from the rows just read back."""
        for row in rows:
            step = row["step"]
            if step % 10 and step != self.steps:
                continue
            elapsed = max(1e-9, time.time() - self.t0)
            rate = (step - start) / elapsed
            log.info(
                "step %d/%d loss %.4f (%.2f steps/s, %.0f tokens/s per process, elapsed %s, ETA %s)",
                step,
                self.steps,
                row["loss"],
                rate,
                self.tokens / elapsed,
                format_seconds(elapsed),
                format_seconds((self.steps - step) / max(rate, 1e-9)),
            )

    # -- checkpoints, resume and the finished store (.checkpoints, .store) --------------------
    def _save_checkpoint(self, step: int, history: list[dict], log_path: Path) -> None:
        if self.dist.is_main:
            write_log(history, log_path)
            state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": cuda_rng_state(self.dist.device),
            }
            self.checkpoints.save(step, self.model, self.save_fn, state)
        distributed.barrier()

    def _resume(self, load_fn: Callable[[torch.nn.Module, Path], None]) -> int:
        found = self.checkpoints.latest_resumable()
        if found is None:
            return 0
        ckpt, state = found
        load_fn(self.model, ckpt / "model")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["torch_rng"].cpu())
        restore_cuda_rng(state["cuda_rng"], self.dist.device)
        log.info("resumed from %s at step %d of %d", ckpt, state["step"], self.steps)
        return int(state["step"])

    @staticmethod
    def _history_until(log_path: Path, start: int) -> list[dict]:
        """The rows of ``train_log.csv`` up to the resumed step (none when starting afresh)."""
        import csv

        if not start or not log_path.exists():
            return []
        with open(log_path) as fh:
            return [row for row in csv.DictReader(fh) if int(row["step"]) <= start]

    def epoch_and_index(self, step: int) -> tuple[int, int]:
        """The epoch of global step ``step`` (0-based) and the step's place in it."""
        return self.batches.epoch_and_index(step)

    def local_items(self, step: int) -> list[Any]:
        """The items of this process's share of global step ``step`` (0-based)."""
        return self.batches.local_items(step)

    def remove_checkpoints(self) -> None:
        """Remove the checkpoints and the running logs (the finished store stays)."""
        if self.dist.is_main:
            self.checkpoints.remove(keep=FINISHED_DIR)

    def finish(self) -> None:
        """Remove the checkpoints once the final model is written (the job succeeded); the
        finished store (:mod:`dprflow.training.store`) stays."""
        self.remove_checkpoints()
        distributed.cleanup()

    def reuse_finished(self, out: Path, load: Callable[[torch.nn.Module, Path], None]) -> bool:
        """Put back the model this stage finished with the same identity, code and stored bytes
        (:class:`~dprflow.training.store.FinishedStore`) as ``out``, instead of training again,
        and load its weights into ``self.model`` (``load(model, folder)``), so the caller holds
        the final weights as after a training; ``False`` when there is none or it may not be
        reused (the log says why)."""
        if not self.store.exists():
            return False
        reason = self.store.why_not(self.checkpoints.identity_difference)
        if reason is not None:
            log.info("not reusing the finished model in %s: %s", self.store.folder, reason)
            return False
        if self.dist.is_main:
            self.store.put_back(out, self.model_bytes())
        load(self.model, self.store.folder / "model")
        log.info(
            "reused the model this stage finished with the same arguments, input contents and code (%s): "
            "no training; delete %s to train again",
            self.store.folder,
            self.store.folder,
        )
        return True

    def model_bytes(self) -> int:
        return state_bytes(self.model.state_dict())


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
    and remove the checkpoints, keeping a copy of the final model (:mod:`dprflow.training.store`):
    a rerun with the same arguments, input contents and code puts it back without training.
    Either way ``model`` ends with the final weights. ``model_class.from_pretrained`` reloads a
    checkpoint's model."""
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
    args = train_args_from(stage_args)
    pad_id = getattr(tokenizer, "pad_token_id", None) or 0
    trainer = Trainer(
        model, items, make_batch, step_fn, save, args, checkpoint_dir, identity, manual_backward, pad_id
    )
    out = Path(stage_args.out)
    if trainer.reuse_finished(out, load):
        trainer.finish()
        return
    log_path = checkpoint_dir / "train_log.csv"
    trainer.train(load, log_path)
    if trainer.dist.is_main:

        def write_model(folder: Path) -> None:
            save(trainer.model, folder)
            (folder / "training_args.json").write_text(
                json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
            )
            shutil.copy(log_path, folder / "train_log.csv")

        # The final weights go to the store first, then the checkpoints go (the store supersedes
        # them and frees their space), then the output is copied from the store: a disk that
        # fills on the way leaves either the checkpoints or the store, so a rerun does not train
        # the steps again.
        trainer.store.keep(write_model, checkpoint_dir / EVENTS_DIR, trainer.model_bytes())
        trainer.remove_checkpoints()
        trainer.store.put_back(out, trainer.model_bytes())
    trainer.finish()
