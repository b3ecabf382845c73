"""Benchmark: how the training steps are fed (issue 33, items 4 and 5), on what a CPU can measure.

For every step type of ``bench_train_throughput.py`` at the benchmark's GPU shapes (64 queries x
8 passages, 128 tokens; BERT-base's shapes do not matter here, only the batches'):

1. **Padding**: the share of padded tokens in the batches' token tensors, each batch padded to
   its longest (as before) and to a multiple of 8, 16 and 32 (``training.pad_to_multiple_of``),
   and how many batch shapes that gives over the batches (what ``torch.compile`` sees).
2. **Host work**: milliseconds per step to build a batch (sampling, masking, padding; the
   retriever from its texts, as before, and from ids made once, ``training.pretokenize``), set
   against the GPU step time the issue measured on an H100 (its tokens/s at these shapes), and
   against a CPU step of the tiny model.
3. **Recompiles**: graphs ``torch.compile`` builds in 100 steps (a counting backend around the
   eager one, so the count is dynamo's whatever the compiler), compiling each Hugging Face
   model's forward as before, and every Transformer layer with dynamic shapes as now
   (:func:`dprflow.training.speed.compile_transformers`), on a 2-layer model.

Ratios are taken in the same run::

    python bench/bench_gpu_feed.py                 # all three (recompiles: a few minutes)
    python bench/bench_gpu_feed.py --parts padding host
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_train_throughput import Task, make_tokenizer  # noqa: E402

from dprflow.training.batches import StepBatches, pad_to_multiple  # noqa: E402
from dprflow.training.speed import compile_transformers, transformers_in  # noqa: E402

TASKS = ("retriever", "condenser", "cocondenser", "mae", "contriever")
MULTIPLES = (0, 8, 16, 32)
# The issue's H100 figures (BERT-base, bf16, these shapes): tokens/s of the Trainer (the plain
# loop for the retriever, the Trainer's row beside it being within 5%).
ISSUE_TOKENS_PER_S = {
    "retriever": 140_011,
    "condenser": 127_405,
    "cocondenser": 117_757,
    "mae": 103_643,
    "contriever": 197_171,
}


def shape_args(model: str, steps: int, texts: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        model=model,
        batch_size=64,
        group_size=8,
        seq_len=128,
        steps=steps,
        warmup=0,
        chunk_size=0,
        texts=texts,
    )


def token_tensors(batch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input ids, attention mask) of every sequence tensor of a batch."""
    parts = batch if isinstance(batch, tuple) else (batch,)
    out = []
    for part in parts:
        if part is None:
            continue
        for key, value in part.items():
            if key.endswith("input_ids"):
                out.append((value, part[key.replace("input_ids", "attention_mask")]))
    return out


def padding(tasks, batches: int, folder: Path) -> list[dict]:
    tokenizer = make_tokenizer(folder)
    rows = []
    for name in tasks:
        task = Task(name, shape_args("micro", batches), tokenizer, folder)
        built = StepBatches(task.items, task.make_batch, seed=13, batch_size=64)
        plain = [built[s] for s in range(batches)]
        row = {"task": name}
        for multiple in MULTIPLES:
            real = total = 0
            shapes = set()
            for batch in plain:
                for ids, mask in token_tensors(pad_to_multiple(batch, multiple)):
                    real += int(mask.sum())
                    total += ids.numel()
                    shapes.add(tuple(ids.shape))
            row[multiple] = (1 - real / total, len(shapes))
        row["tokens_per_step"] = real / batches
        rows.append(row)
    return rows


def host_time(tasks, steps: int, folder: Path) -> list[dict]:
    """Milliseconds to build a step's batch, and a CPU step of the tiny model on it."""
    tokenizer = make_tokenizer(folder)
    rows = []
    variants = [(name, False) for name in tasks] + ([("retriever", True)] if "retriever" in tasks else [])
    for name, texts in variants:
        task = Task(name, shape_args("tiny", steps, texts), tokenizer, folder)
        built = StepBatches(task.items, task.make_batch, seed=13, batch_size=64, pad_multiple=8)
        built[0]
        started = time.perf_counter()
        batches = [built[s] for s in range(steps)]
        host = (time.perf_counter() - started) / steps
        model = task.model_fn().train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        started = time.perf_counter()
        for batch in batches[:2]:
            task.step(model, batch, lambda loss: loss.backward())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        step = (time.perf_counter() - started) / 2
        tokens = sum(int(mask.sum()) for b in batches for _, mask in token_tensors(b)) / steps
        rows.append(
            {
                "task": name + (" (texts)" if texts else ""),
                "host_ms": 1e3 * host,
                "cpu_step_ms": 1e3 * step,
                "gpu_step_ms": 1e3 * tokens / ISSUE_TOKENS_PER_S[name],
            }
        )
    return rows


def recompiles(tasks, steps: int, folder: Path) -> list[dict]:
    """Graphs compiled over ``steps`` steps of each task, before and now (module docstring)."""
    import torch._dynamo

    tokenizer = make_tokenizer(folder)
    rows = []
    for name in tasks:
        args = argparse.Namespace(
            model="micro", batch_size=4, group_size=2, seq_len=64, steps=steps, warmup=0, chunk_size=0
        )
        task = Task(name, args, tokenizer, folder)
        built = StepBatches(task.items, task.make_batch, seed=13, batch_size=4)
        row = {"task": name}
        for mode in ("before", "now"):
            torch._dynamo.reset()
            graphs: list[int] = []

            def counting(gm, inputs, graphs=graphs):
                graphs.append(1)
                return gm.forward

            model = task.model_fn().train()
            if mode == "before":  # 4330655: each Hugging Face model's forward, default shapes
                for module in transformers_in(model):
                    module.compile(backend=counting)
            else:
                compile_transformers(model, backend=counting)
            first = 0
            for s in range(steps):
                task.step(model, built[s], lambda loss: loss.backward())
                model.zero_grad(set_to_none=True)
                first = len(graphs) if s == 9 else first
            row[mode] = (first, len(graphs))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="*", default=["padding", "host", "recompiles"])
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--batches", type=int, default=20, help="batches for the padding and host figures")
    parser.add_argument("--steps", type=int, default=100, help="steps for the recompile count")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    from dprflow.progress import quiet_hugging_face

    quiet_hugging_face()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}; {args.threads} threads; shapes 64 x 8 passages, 128 tokens", flush=True
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "padding" in args.parts:
            print(
                "\n| step | padded, longest | x8 | x16 | x32 | shapes: longest / x8 / x16 / x32 | real tokens per step |"
            )
            print("|---|---|---|---|---|---|---|")
            for row in padding(args.tasks, args.batches, folder):
                shares = " | ".join(f"{row[m][0]:.1%}" for m in MULTIPLES)
                shapes = " / ".join(str(row[m][1]) for m in MULTIPLES)
                print(f"| {row['task']} | {shares} | {shapes} | {row['tokens_per_step']:.0f} |", flush=True)
        if "host" in args.parts:
            print(
                "\n| step | batch building, ms | issue's H100 step, ms | host / H100 step | tiny model CPU step, ms |"
            )
            print("|---|---|---|---|---|")
            for row in host_time(args.tasks, args.batches, folder):
                print(
                    f"| {row['task']} | {row['host_ms']:.1f} | {row['gpu_step_ms']:.0f} | "
                    f"{row['host_ms'] / row['gpu_step_ms']:.0%} | {row['cpu_step_ms']:.0f} |",
                    flush=True,
                )
        if "recompiles" in args.parts:
            print(f"\n| step | graphs compiled before: first 10 steps / {args.steps} steps | now |")
            print("|---|---|---|")
            for row in recompiles(args.tasks, args.steps, folder):
                (b10, b100), (n10, n100) = row["before"], row["now"]
                print(f"| {row['task']} | {b10} / {b100} | {n10} / {n100} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
