"""Benchmark: the memory estimate of every step type against the peak a real step reaches.

For each step type of ``bench_train_throughput.py`` (retriever, Condenser, coCondenser, BMAE,
Contriever with MoCo) the model and AdamW are built and one step runs (AdamW's moments are
allocated in it); the peak of the next step is measured and compared with the estimate the stage
computes before it trains (its ``step_memory`` and :func:`dprflow.training.memory.estimate_step_bytes`,
the stage's arguments set to the batch's shape), less the estimate's allowance for the process
itself (``PROCESS_BYTES``: Python, torch, transformers, host memory):

- on a GPU: ``torch.cuda.max_memory_allocated`` (weights, AdamW state, activations);
- on a CPU: the peak of the bytes held by live tensors (weights, buffers, gradients, AdamW
  state, activations, temporaries), counted by torch's ``MemTracker`` (a dispatch mode that sees
  every tensor the step allocates and frees): exact and the same on a busy machine, unlike the
  process's resident set, which holds the allocator's freed blocks and torch's thread pools.

Ratio = estimate / measured: the estimate is meant as an upper bound (>= 1) within 1.5x (issue 34:
it was 2.15x a Condenser step on a GPU). ``tests/test_memory_estimates.py`` checks the CPU ratios
at a small size::

    python bench/bench_step_memory.py                          # CPU, every step type
    python bench/bench_step_memory.py --device cuda --model base --batch-size 12 --seq-len 512
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TASKS = ("retriever", "condenser", "cocondenser", "mae", "contriever")
MIB = 2**20


def measure_one(task: str, model: str, batch_size: int, group_size: int, seq_len: int, device: str) -> dict:
    """Build ``task``'s model, run a step, then measure the peak of the next (module docstring)."""
    import torch
    from _common import stage_estimate, stage_step
    from bench_train_throughput import Task, make_tokenizer

    from dprflow.precision import resolve_precision
    from dprflow.training.memory import PROCESS_BYTES

    dev = torch.device(device)
    precision = resolve_precision("auto", dev)
    args = argparse.Namespace(
        model=model, batch_size=batch_size, group_size=group_size, seq_len=seq_len, steps=1, warmup=1,
        chunk_size=0,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        task_ = Task(task, args, make_tokenizer(Path(tmp)), Path(tmp))
        measured, shape = step_peak(task_, dev, precision, batch_size)
    described = stage_step(task, batch_size, group_size, seq_len, shape, precision)
    cuda = dev.type == "cuda"
    estimate = stage_estimate(task, shape, batch_size, group_size, seq_len, precision, cuda) - PROCESS_BYTES
    return {
        "task": task,
        "estimate_mib": estimate / MIB,
        "measured_mib": measured / MIB,
        "ratio": estimate / measured,
        "precision": precision,
        "step": described.describe(),
    }


def step_peak(task, dev, precision: str, batch_size: int):
    """Peak bytes of a step of ``task`` at ``batch_size`` with AdamW's state allocated (GPU: the
    second step's allocated; CPU: live tensors, module docstring) and the encoder's shape."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from dprflow.precision import autocast
    from dprflow.training.batches import StepBatches
    from dprflow.training.memory import EncoderShape, encoder_config

    cuda = dev.type == "cuda"
    net = task.model_fn().to(dev).train()
    optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-5)
    batches = StepBatches(task.items, task.make_batch, seed=13, batch_size=batch_size)

    def step(index: int) -> None:
        batch = _to(batches[index], dev)
        with autocast(precision, dev):
            task.step(net, batch, lambda t: t.backward())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if cuda:
        step(0)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        step(1)
        measured = torch.cuda.max_memory_allocated(dev)
    else:
        adamw_state(optimizer)  # what a first step leaves (faster than running one on a CPU)
        tracker = MemTracker()
        # MemTracker hooks the gradient of every parameter its modules run, and a frozen one
        # (the unused pooler, MoCo's key encoder) takes no hook: mark those as hooked already.
        for param in net.parameters():
            if not param.requires_grad:
                tracker._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
        tracker.track_external(net, optimizer)
        with tracker:
            step(1)
        measured = tracker.get_tracker_snapshot("peak")[dev]["Total"]
    # the encoder's shape from its config, as the stage reads it (the model's own parameters
    # include the head, decoder or key encoder, which the stage's step_memory adds itself)
    return measured, EncoderShape.of(encoder_config(net))


def adamw_state(optimizer) -> None:
    """AdamW's state as its first step creates it (a step count and two moments per weight)."""
    import torch

    for group in optimizer.param_groups:
        for param in group["params"]:
            optimizer.state[param] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }


class _NoHook:
    def remove(self) -> None:
        pass


def _to(batch, device):
    if isinstance(batch, tuple):
        return tuple(None if b is None else _to(b, device) for b in batch)
    return {k: v.to(device) for k, v in batch.items()}


def measure(tasks, model: str, batch_size: int, group_size: int, seq_len: int, device: str) -> list[dict]:
    return [measure_one(task, model, batch_size, group_size, seq_len, device) for task in tasks]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="tiny", choices=["micro", "tiny", "base"])
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (CPU runs)")
    parser.add_argument("--no-write", action="store_true", help="print only, write no results/bench files")
    args = parser.parse_args(argv)
    import torch

    from dprflow.progress import quiet_hugging_face

    quiet_hugging_face()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    rows = measure(args.tasks, args.model, args.batch_size, args.group_size, args.seq_len, args.device)
    print(
        f"model {args.model}, batch {args.batch_size} (group {args.group_size}), {args.seq_len} tokens, "
        f"{args.device}, {rows[0]['precision']}; torch {torch.__version__}"
    )
    print("| step | estimate MiB | measured MiB | estimate / measured |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['task']} | {row['estimate_mib']:.0f} | {row['measured_mib']:.0f} | {row['ratio']:.2f} |"
        )
        if not args.no_write:
            from _common import write_bench

            write_bench(
                f"step_memory_{row['task']}_{args.model}_{args.device}",
                round(row["ratio"], 3),
                "x (estimate / measured peak)",
                estimate_mib=round(row["estimate_mib"], 1),
                measured_mib=round(row["measured_mib"], 1),
                precision=row["precision"],
                batch_size=args.batch_size,
                seq_len=args.seq_len,
                n=1,
                seconds=0,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
