"""Benchmark: training throughput (tokens/s) of the project's Trainer against a plain loop.

Two training steps of the papers, on the same model, data and batch:

- Condenser pre-training (Condenser §3): MLM batches of ``--seq-len`` tokens built by the stage's
  own ``mlm_batch`` (masking included);
- retriever fine-tuning (coCondenser §3.4 / CDMAE eq. 10): a bi-encoder, queries and groups of
  ``--group-size`` passages tokenized per step as ``train_retriever`` does, contrastive loss with
  in-batch negatives.

Each is run by the plain loop a Hugging Face user writes (batch, forward, backward, clip, AdamW,
schedule) and by :class:`dprflow.training.trainer.Trainer` (batches of (seed, step), logging,
checkpoint bookkeeping), then by the Trainer with its options: DataLoader workers, gradient
checkpointing, the fine-tuning gradient cache and, on a GPU, bf16 against fp32. Throughput is
real (unpadded) tokens per second over the timed steps, after untimed warm-up steps; on a GPU the
peak allocated memory of the timed run is reported too.

Standalone: it needs torch, transformers and this repository's ``src`` only (no Snakemake,
pyserini or faiss), builds its models from ``BertConfig`` (``--model tiny`` or ``--model base``,
BERT-base sized) and its tokenizer from a generated vocabulary, so nothing is downloaded::

    python bench/bench_train_throughput.py                       # CPU, tiny model (make bench)
    python bench/bench_train_throughput.py --device cuda --model base

Figures go to results/bench/train_*.json (bench/summarize.py), with the device they ran on.
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import write_bench  # noqa: E402
from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast  # noqa: E402

from dprflow.finetuning.biencoder import BiEncoder  # noqa: E402
from dprflow.finetuning.losses import contrastive_loss  # noqa: E402
from dprflow.precision import autocast, resolve_precision  # noqa: E402
from dprflow.pretraining.condenser.data import mlm_batch  # noqa: E402
from dprflow.pretraining.condenser.model import Condenser, CondenserConfig  # noqa: E402
from dprflow.progress import quiet_hugging_face  # noqa: E402
from dprflow.training.batches import StepBatches, count_tokens  # noqa: E402
from dprflow.training.steps import biencoder_step  # noqa: E402
from dprflow.training.trainer import TrainArgs, Trainer  # noqa: E402

WORDS = 4000  # vocabulary of the generated texts
MODELS = {
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, intermediate_size=512),
    "base": dict(),  # BertConfig's defaults: BERT-base (768 hidden, 12 layers, 12 heads)
}


def make_tokenizer(folder: Path) -> BertTokenizerFast:
    """A WordPiece tokenizer over the words w0..w{WORDS-1} (one token each)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(WORDS)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))


def texts(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[str]:
    """``n`` texts of ``lo..hi`` words drawn with a Zipf-like law (frequent words repeat)."""
    ranks = np.minimum(rng.zipf(1.2, size=(n, hi)), WORDS) - 1
    lengths = rng.integers(lo, hi + 1, size=n)
    return [" ".join(f"w{r}" for r in row[:k]) for row, k in zip(ranks, lengths, strict=True)]


class Task:
    """A model factory, training items, ``make_batch`` and ``step_fn`` (whole batch or cached)."""

    def __init__(self, name: str, args: argparse.Namespace, tokenizer, folder: Path) -> None:
        self.name = name
        rng = np.random.default_rng(0)
        config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **MODELS[args.model])
        n_items = args.batch_size * (args.steps + args.warmup + 1)
        if name == "condenser":
            torch.manual_seed(0)
            BertForMaskedLM(config).save_pretrained(folder / "mlm")
            self.model_fn = lambda: Condenser.from_pretrained(folder / "mlm", CondenserConfig())
            pieces = tokenizer(
                texts(rng, n_items, args.seq_len - 2, args.seq_len - 2), add_special_tokens=False
            )
            self.items = [ids[: args.seq_len - 2] for ids in pieces["input_ids"]]
            self.make_batch = lambda rng, items: mlm_batch(items, tokenizer, rng, 0.15)
        else:
            torch.manual_seed(0)
            BertModel(config).save_pretrained(folder / "encoder")
            self.model_fn = lambda: BiEncoder.from_pretrained(folder / "encoder", pooling="cls")
            queries = texts(rng, n_items, 4, 16)
            passages = texts(rng, n_items * args.group_size, args.seq_len // 2, args.seq_len - 2)
            self.items = [
                (q, passages[i * args.group_size : (i + 1) * args.group_size]) for i, q in enumerate(queries)
            ]

            def make_batch(rng, items):
                tok = dict(truncation=True, padding=True, return_tensors="pt")
                q = tokenizer([q for q, _ in items], max_length=32, **tok)
                p = tokenizer([p for _, group in items for p in group], max_length=args.seq_len, **tok)
                return q, p

            self.make_batch = make_batch
        self.group_size = args.group_size

    def step_fn(self, chunk_size: int = 0):
        if self.name == "condenser":

            def step(m, batch):
                device = next(m.parameters()).device
                return {"loss": m(**{k: v.to(device, non_blocking=True) for k, v in batch.items()}).loss}

            return step, False

        def step(m, batch, backward):
            device = next(m.parameters()).device
            q, p = (x.to(device, non_blocking=True) for x in batch)
            loss = lambda qe, pe: contrastive_loss(qe, pe, group_size=self.group_size)  # noqa: E731
            return biencoder_step(m, q, p, loss, chunk_size, backward)

        return step, True


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(task: Task, args, device: torch.device, precision: str, steps: int):
    """The loop a Hugging Face user writes (AdamW, linear schedule, clip at 1, autocast), ready to run."""
    model = task.model_fn().to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / steps))
    resolved = resolve_precision(precision, device)
    scaler = torch.amp.GradScaler("cuda") if resolved == "fp16" else None
    batches = StepBatches(task.items, task.make_batch, seed=13, batch_size=args.batch_size)
    return lambda: _plain_steps(task, model, optimizer, schedule, scaler, batches, resolved, device, steps)


def _plain_steps(task, model, optimizer, schedule, scaler, batches, resolved, device, steps) -> None:
    for step in range(steps):
        batch = batches[step]
        with autocast(resolved, device):
            if task.name == "condenser":
                loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
            else:
                q, p = model(batch[0].to(device), batch[1].to(device))
                loss = contrastive_loss(q, p, group_size=task.group_size)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)


def trainer_loop(task: Task, args, device, precision, steps, folder: Path, **options):
    """The project's Trainer over the same batches, ready to run."""
    chunk_size = options.pop("chunk_size", 0)
    step_fn, manual = task.step_fn(chunk_size)
    train_args = TrainArgs(
        batch_size=args.batch_size,
        learning_rate=1e-5,
        max_steps=steps,
        checkpoint_every=10**9,
        precision=precision,
        **options,
    )
    trainer = Trainer(
        task.model_fn(),
        task.items,
        task.make_batch,
        step_fn,
        lambda m, out: None,
        train_args,
        folder / "ckpt",
        {},
        manual_backward=manual,
    )
    return lambda: trainer.train(lambda m, d: None, folder / "train_log.csv")


def loop(task: Task, args, device, precision: str, folder: Path, options: dict | None, steps: int):
    """The plain loop (``options`` None) or the Trainer with ``options``, for ``steps`` steps."""
    if options is None:
        return plain_loop(task, args, device, precision, steps)
    return trainer_loop(task, args, device, precision, steps, folder, **options)


def measure(label: str, setup, task: Task, args, device: torch.device) -> dict:
    """Run ``setup(warmup)()`` untimed, then time ``setup(steps)()`` (the model is built before
    the clock starts); tokens are those of the timed steps' batches. The peak memory counts
    the weights, the optimizer state and the activations of the timed run."""
    setup(args.warmup)()
    gc.collect()
    sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    run = setup(args.steps)
    sync(device)
    started = time.perf_counter()
    run()
    sync(device)
    seconds = time.perf_counter() - started
    del run
    batches = StepBatches(task.items, task.make_batch, seed=13, batch_size=args.batch_size)
    n_tokens = sum(count_tokens(batches[s]) for s in range(args.steps))
    row = {
        "label": label,
        "tokens_per_s": n_tokens / seconds,
        "seconds": seconds,
        "tokens": n_tokens,
        "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
    }
    peak = f", peak {row['peak_mib']:.0f} MiB" if row["peak_mib"] is not None else ""
    print(
        f"  {label}: {row['tokens_per_s']:.0f} tokens/s ({seconds:.2f} s, {n_tokens} tokens{peak})",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    parser.add_argument(
        "--tasks", nargs="*", default=["condenser", "retriever"], choices=["condenser", "retriever"]
    )
    parser.add_argument("--steps", type=int, default=0, help="timed steps (0: 12 on CPU, 30 on GPU)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=0, help="0: 8 on CPU, 64 on GPU")
    parser.add_argument(
        "--group-size", type=int, default=0, help="passages per query (0: 4 on CPU, 8 on GPU)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=0, help="tokens per sequence (0: 64 on CPU, 128 on GPU)"
    )
    parser.add_argument("--chunk-size", type=int, default=0, help="gradient cache chunk (0: batch / 4)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the workers row")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each variant, interleaved; the best counts"
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["plain", "trainer", "workers", "checkpointing", "cache"],
        choices=["plain", "trainer", "workers", "checkpointing", "cache"],
        help="loops to measure (the plain loop, else the Trainer, is the baseline of the ratios)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (CPU runs)")
    parser.add_argument("--no-write", action="store_true", help="print only, write no results/bench files")
    args = parser.parse_args(argv)
    quiet_hugging_face()
    if args.device == "cpu":
        # The Trainer takes a GPU whenever one is visible: hide them for a CPU measurement.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if torch.cuda.is_available():
            parser.error("--device cpu: CUDA was initialised before the GPUs could be hidden")
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    args.steps = args.steps or (30 if gpu else 12)
    args.batch_size = args.batch_size or (64 if gpu else 8)
    args.group_size = args.group_size or (8 if gpu else 4)
    args.seq_len = args.seq_len or (128 if gpu else 64)
    args.chunk_size = args.chunk_size or max(1, args.batch_size // 4)
    if not gpu:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if gpu else f"CPU, {torch.get_num_threads()} torch threads"
    print(
        f"device: {name}; model {args.model}; batch {args.batch_size}, group {args.group_size}, "
        f"{args.seq_len} tokens, {args.steps} timed steps",
        flush=True,
    )
    precisions = ["fp32", "bf16"] if gpu and torch.cuda.is_bf16_supported() else ["fp32"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer = make_tokenizer(folder)
        for task_name in args.tasks:
            task = Task(task_name, args, tokenizer, folder)
            print(f"{task_name}:", flush=True)
            for precision in precisions:
                variants: list[tuple[str, dict | None]] = [
                    ("plain", None),
                    ("trainer", {}),
                    (f"trainer_workers{args.workers}", {"num_workers": args.workers}),
                    ("trainer_checkpointing", {"gradient_checkpointing": True}),
                ]
                if task_name == "retriever":
                    variants.append((f"trainer_cache{args.chunk_size}", {"chunk_size": args.chunk_size}))
                kinds = {"plain": "plain", "trainer": "trainer", "trainer_workers": "workers"}
                kinds.update({"trainer_checkpointing": "checkpointing", "trainer_cache": "cache"})
                variants = [
                    (label, options)
                    for label, options in variants
                    if kinds[label.rstrip("0123456789")] in args.variants
                ]
                # Repeats interleave the variants, and the best of each is kept: on a shared
                # machine the other load only ever slows a run down.
                best: dict[str, dict] = {}
                for _ in range(args.repeats):
                    for label, options in variants:
                        setup = functools.partial(loop, task, args, device, precision, folder, options)
                        row = measure(f"{task_name}_{label}_{precision}", setup, task, args, device)
                        if label not in best or row["tokens_per_s"] > best[label]["tokens_per_s"]:
                            best[label] = {**row, "task": task_name, "loop": label, "precision": precision}
                rows += best.values()
    print()
    print("| task | loop | precision | tokens/s | vs plain | peak MiB |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        plain = next(  # the plain loop, else the Trainer without options
            r
            for r in rows
            if r["task"] == row["task"]
            and r["precision"] == row["precision"]
            and r["loop"] in ("plain", "trainer")
        )
        ratio = row["tokens_per_s"] / plain["tokens_per_s"]
        peak = "" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}"
        print(
            f"| {row['task']} | {row['loop']} | {row['precision']} | {row['tokens_per_s']:.0f} | {ratio:.2f} | {peak} |"
        )
        if not args.no_write:
            write_bench(
                f"train_{row['label']}_{args.model}_{args.device}",
                round(row["tokens_per_s"], 1),
                "tokens/s",
                baseline=round(plain["tokens_per_s"], 1),
                ratio=round(ratio, 3),
                n=row["tokens"],
                seconds=round(row["seconds"], 3),
                peak_mib=None if row["peak_mib"] is None else round(row["peak_mib"], 1),
                device=name,
                batch_size=args.batch_size,
                group_size=args.group_size,
                seq_len=args.seq_len,
            )
    return 0 if all(math.isfinite(r["tokens_per_s"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
