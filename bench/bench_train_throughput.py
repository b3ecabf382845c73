"""Benchmark: training throughput and model FLOPs utilisation (MFU) of every step type.

The step types of the papers, on the same BERT-sized model (``--model tiny`` or ``base``):

- ``retriever``: bi-encoder fine-tuning (coCondenser §3.4 / CDMAE eq. 10), queries and groups of
  ``--group-size`` passages, contrastive loss with in-batch negatives; ``retriever_cache``: the
  same with the gradient cache in chunks of ``--chunk-size``;
- ``condenser``: Condenser MLM pre-training (Condenser §3); ``cocondenser`` and
  ``cocondenser_cache``: coCondenser's MLM + span contrastive loss (§3.2-3.3), whole or cached;
- ``mae``: a bottlenecked MAE step (BMAE; CDMAE §3.1, encoder and weak decoder);
- ``contriever``: Contriever with MoCo (§3.1.3; the key encoder runs forward only).

Each runs in the plain loop a Hugging Face user writes (batch, the step's forward and backward,
clip, AdamW, schedule) and in :class:`dprflow.training.trainer.Trainer` with its defaults (the
speed switches of config/schema.yaml's training section), in the same process. Reported per row:
real (unpadded) tokens/s over the timed steps after untimed warm-up steps, MFU, peak memory (GPU:
allocated; CPU: the process's peak resident set over the run) and the training stage's memory
estimate of the step that ran (:func:`estimate_mib`: with a gradient cache, of the chunk its steps
encoded, the configured one in the plain loop, the one the Trainer chose from the GPU's memory).

MFU (PaLM, Chowdhery et al. 2022, appendix B) counts the model's FLOPs, not what recomputation
(gradient cache, checkpointing) adds. Per step::

    FLOPs = sum over sequences trained:  6 N s + 12 L H s^2
          + sum over forward-only ones:  2 N s +  4 L H s^2      (MoCo's key encoder)

with ``s`` the sequence's real tokens, ``N`` the weights of the linear layers it goes through
(embedding look-ups are not products; a tied MLM decoder counts), ``L`` its Transformer layers and
``H`` the hidden size (the ``s^2`` terms: the products ``Q K^T`` and ``A V``, forward 4 L H s^2,
backward twice that). MFU = FLOPs / seconds / the device's peak: the dense bf16 (or TF32 for
fp32) tensor-core peak from the datasheet (:data:`PEAK_TFLOPS`), and on a CPU the fp32 matrix
product rate measured in the same run (:func:`cpu_peak_flops`).

Standalone: it needs torch, transformers and this repository's ``src`` only (no Snakemake,
pyserini or faiss), builds its models from ``BertConfig`` and its tokenizer from a generated
vocabulary, so nothing is downloaded::

    python bench/bench_train_throughput.py                       # CPU, tiny model (make bench)
    python bench/bench_train_throughput.py --device cuda --model base

Figures go to results/bench/train_*.json (bench/summarize.py), with the device they ran on. With
``--csv-dir DIR`` the table also goes to ``DIR/<date>-<device>.csv`` (:data:`CSV_COLUMNS`; ``make
gpu-check`` writes bench/gpu/), rewritten after each step type, so a run cut short keeps its rows.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import functools
import gc
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from _common import reset_peak_rss, stage_estimate, status_kib, write_bench  # noqa: E402
from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast  # noqa: E402

from dprflow.finetuning.biencoder import BiEncoder  # noqa: E402
from dprflow.finetuning.losses import contrastive_loss  # noqa: E402
from dprflow.finetuning.pretokenized import TokenRows, single_batch  # noqa: E402
from dprflow.precision import autocast, resolve_precision  # noqa: E402
from dprflow.pretraining.condenser.data import mlm_batch  # noqa: E402
from dprflow.pretraining.condenser.model import Condenser, CondenserConfig  # noqa: E402
from dprflow.pretraining.contriever.data import PairMaker  # noqa: E402
from dprflow.pretraining.contriever.model import Contriever, ContrieverConfig  # noqa: E402
from dprflow.pretraining.mae.data import TokenText, mae_batch  # noqa: E402
from dprflow.pretraining.mae.model import BottleneckedMAE, MAEConfig  # noqa: E402
from dprflow.progress import quiet_hugging_face  # noqa: E402
from dprflow.stage_args import TrainArgs  # noqa: E402
from dprflow.training import steps as training_steps  # noqa: E402
from dprflow.training.batches import StepBatches  # noqa: E402
from dprflow.training.memory import PROCESS_BYTES, EncoderShape  # noqa: E402
from dprflow.training.steps import biencoder_step, cocondenser_step  # noqa: E402
from dprflow.training.trainer import Trainer  # noqa: E402

WORDS = 4000  # vocabulary of the generated texts
MODELS = {
    "micro": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256),  # tests
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, intermediate_size=512),
    "base": dict(),  # BertConfig's defaults: BERT-base (768 hidden, 12 layers, 12 heads)
}
TASKS = (
    "retriever",
    "retriever_cache",
    "condenser",
    "cocondenser",
    "cocondenser_cache",
    "mae",
    "contriever",
    "bert",
    "bert_passages",
)
# The step types with a padding-free path (training.attention: packed); the packed variant runs
# for these only (elsewhere it would time the Trainer's sdpa row again).
PACKED_TASKS = ("retriever", "retriever_cache", "condenser", "cocondenser", "cocondenser_cache")
# The table as CSV (--csv-dir), one row per step type and loop: device (torch's name of the GPU,
# or "CPU, n torch threads"), torch, transformers, cuda (torch.version.cuda: the CUDA torch was
# built with, empty for a CPU-only torch), step (a task of TASKS), loop (plain, trainer, compile,
# checkpointing, packed), batch (the step's batch: "B" sequences, or "BxG" for the retriever's B
# queries with G passages each and the bare model over those B x G passages), length (tokens a sequence
# at most; the retriever's queries are shorter), tokens_per_s (real tokens a second over the
# timed steps), mfu (model FLOPs utilisation, a fraction), peak_mib (the GPU's peak allocated
# MiB; on a CPU the process's peak resident set, empty where it cannot be reset), estimate_mib
# (:func:`estimate_mib`) and estimate_over_peak (empty without a peak).
CSV_COLUMNS = (
    "device",
    "torch",
    "transformers",
    "cuda",
    "step",
    "loop",
    "batch",
    "length",
    "tokens_per_s",
    "mfu",
    "peak_mib",
    "estimate_mib",
    "estimate_over_peak",
)
# Dense tensor-core peaks in TFLOP/s from the vendors' datasheets (SXM parts; no sparsity):
# bf16/fp16, and TF32 for fp32 matrix products. Matched by a substring of the device name.
PEAK_TFLOPS = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.5},
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.5},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "fp32": 183.0},
    "A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 62.5},
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0},
}


def make_tokenizer(folder: Path) -> BertTokenizerFast:
    """A WordPiece tokenizer over the words w0..w{WORDS-1} (one token each)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(WORDS)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # from_pretrained reads vocab.txt (transformers 5 ignores BertTokenizerFast(vocab_file=...),
    # which left a tokenizer of the 5 special tokens: every word became [UNK]).
    tokenizer = BertTokenizerFast.from_pretrained(str(folder))
    assert len(tokenizer) == len(vocab), len(tokenizer)
    return tokenizer


def texts(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[str]:
    """``n`` texts of ``lo..hi`` words drawn with a Zipf-like law (frequent words repeat)."""
    ranks = np.minimum(rng.zipf(1.2, size=(n, hi)), WORDS) - 1
    lengths = rng.integers(lo, hi + 1, size=n)
    return [" ".join(f"w{r}" for r in row[:k]) for row, k in zip(ranks, lengths, strict=True)]


def token_rows(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[np.ndarray]:
    """``n`` rows of ``lo..hi`` token ids (no special tokens), Zipf-like."""
    lengths = rng.integers(lo, hi + 1, size=n)
    return [np.minimum(rng.zipf(1.2, size=k), WORDS) + 4 for k in lengths]


def linear_params(module: torch.nn.Module) -> int:
    """N of the MFU formula: weights of the linear layers (a tied decoder counts)."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


def n_layers(module: torch.nn.Module) -> int:
    return sum(type(m).__name__ == "BertLayer" for m in module.modules())


def sequence_flops(n: int, layers: int, hidden: int, mask: torch.Tensor, trained: bool) -> float:
    """6 N s + 12 L H s^2 per sequence of ``s`` real tokens (2 N s + 4 L H s^2 forward only)."""
    s = mask.sum(dim=1).double()
    linear, attention = (6, 12) if trained else (2, 4)
    return float((linear * n * s + attention * layers * hidden * s**2).sum())


class Task:
    """A model factory, training items, ``make_batch``, a step (it runs its own backward) and the
    model FLOPs of a batch."""

    def __init__(self, name: str, args: argparse.Namespace, tokenizer, folder: Path) -> None:
        self.name = name
        rng = np.random.default_rng(0)
        config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **MODELS[args.model])
        self.hidden = config.hidden_size
        n_items = args.batch_size * (args.steps + args.warmup + 1)
        self.chunk_size = args.chunk_size if name.endswith("_cache") else 0
        torch.manual_seed(0)
        BertForMaskedLM(config).save_pretrained(folder / "mlm")
        BertModel(config).save_pretrained(folder / "encoder")
        span = args.seq_len - 2
        if name.startswith("retriever"):
            self.model_fn = lambda: BiEncoder.from_pretrained(folder / "encoder", pooling="cls")
            queries = texts(rng, n_items, 4, 16)
            passages = texts(rng, n_items * args.group_size, args.seq_len // 2, span)
            g = args.group_size
            self.items = [(q, passages[i * g : (i + 1) * g]) for i, q in enumerate(queries)]

            def from_texts(rng, items):  # the texts tokenized inside the step (--texts)
                tok = dict(truncation=True, padding=True, return_tensors="pt")
                q = tokenizer([q for q, _ in items], max_length=32, **tok)
                p = tokenizer([p for _, group in items for p in group], max_length=args.seq_len, **tok)
                return q, p

            self.make_batch = from_texts
            if not getattr(args, "texts", False):  # as train_retriever: ids made once (pretokenize)
                q_ids, p_ids = (
                    TokenRows.tokenize(queries, tokenizer, 30),
                    TokenRows.tokenize(passages, tokenizer, span),
                )
                self.items = [(i, range(i * g, (i + 1) * g)) for i in range(len(queries))]
                self.make_batch = lambda rng, items: (
                    single_batch([q_ids[i] for i, _ in items], tokenizer, 32),
                    single_batch([p_ids[j] for _, group in items for j in group], tokenizer, args.seq_len),
                )
        elif name in ("condenser", "cocondenser", "cocondenser_cache"):
            self.model_fn = lambda: Condenser.from_pretrained(folder / "mlm", CondenserConfig())
            # coCondenser: rows 2j and 2j+1 are two spans of document j.
            self.items = [row.tolist() for row in token_rows(rng, n_items, span // 2, span)]
            self.make_batch = lambda rng, items: mlm_batch(items, tokenizer, rng, 0.15)
        elif name == "mae":
            self.model_fn = lambda: BottleneckedMAE.from_pretrained(folder / "mlm", MAEConfig())
            self.items = [TokenText(row, None) for row in token_rows(rng, n_items, span // 2, span)]
            self.make_batch = lambda rng, items: mae_batch(
                "bmae", items, tokenizer, rng, p_enc=0.3, p_dec=0.5
            )
        elif name.startswith("bert"):  # the bare model: every sequence full, no head, no loss to speak of
            # bert: the batch's B sequences (Condenser's shape); bert_passages: its B x G passages
            per_item = args.group_size if name == "bert_passages" else 1
            self.model_fn = lambda: BertModel.from_pretrained(folder / "encoder", add_pooling_layer=False)
            self.items = list(torch.randint(5, len(tokenizer), (n_items, per_item, args.seq_len)))
            self.make_batch = lambda rng, items: {
                "input_ids": torch.cat(items),
                "attention_mask": torch.ones(len(items) * per_item, args.seq_len, dtype=torch.long),
            }
        elif name == "contriever":
            encoder = folder / "encoder"
            self.model_fn = lambda: Contriever(
                BertModel.from_pretrained(encoder), ContrieverConfig(negatives="moco", queue_size=4096)
            )
            maker = PairMaker.from_tokenizer(tokenizer, p_delete=0.0)
            rows = token_rows(rng, 2 * n_items, span // 2, span)
            self.items = list(zip(rows[::2], rows[1::2], strict=True))

            def make_batch(rng, items):
                q_ids, q_mask = maker.pad([q.tolist() for q, _ in items])
                k_ids, k_mask = maker.pad([k.tolist() for _, k in items])
                return {
                    "q_input_ids": q_ids,
                    "q_attention_mask": q_mask,
                    "k_input_ids": k_ids,
                    "k_attention_mask": k_mask,
                }

            self.make_batch = make_batch
        else:
            raise ValueError(f"unknown task {name!r}; allowed: {', '.join(TASKS)}")
        self.group_size = args.group_size

    def step(self, m, batch, backward):
        """One step's forward and backward(s); returns the values to log."""
        if self.name.startswith("retriever"):
            loss = lambda qe, pe: contrastive_loss(qe, pe, group_size=self.group_size)  # noqa: E731
            return biencoder_step(m, batch[0], batch[1], loss, self.chunk_size, backward)
        if self.name.startswith("cocondenser"):
            return {"loss": cocondenser_step(m, batch, self.chunk_size, backward).loss}
        if self.name.startswith("bert"):
            loss = m(**batch).last_hidden_state.float().square().mean()
            backward(loss)
            return {"loss": loss.detach()}
        out = m(**batch)
        backward(out.loss)
        return {"loss": out.loss.detach()}

    def masks(self, batch) -> list[torch.Tensor]:
        """The attention masks of the sequences a step trains on (MoCo keys included)."""
        if self.name.startswith("retriever"):
            return [b["attention_mask"] for b in batch]
        if self.name == "contriever":
            return [batch["q_attention_mask"], batch["k_attention_mask"]]
        return [batch["attention_mask"] if "attention_mask" in batch else batch["enc_attention_mask"]]

    def tokens(self, batch) -> int:
        """Real tokens of a step's input (an MAE's decoder re-reads the encoder's text: counted once)."""
        return int(sum(int(m.sum()) for m in self.masks(batch)))

    def flops(self, model, batch) -> float:
        """Model FLOPs of one step (module docstring)."""
        if self.name.startswith("retriever"):
            n, layers = linear_params(model), n_layers(model)
            return sum(sequence_flops(n, layers, self.hidden, b["attention_mask"], True) for b in batch)
        if self.name == "contriever":
            n, layers = linear_params(model.encoder), n_layers(model.encoder)
            return sequence_flops(n, layers, self.hidden, batch["q_attention_mask"], True) + sequence_flops(
                n, layers, self.hidden, batch["k_attention_mask"], False
            )
        mask = batch.get("attention_mask", batch.get("enc_attention_mask"))
        return sequence_flops(linear_params(model), n_layers(model), self.hidden, mask, True)


def cpu_peak_flops(seconds: float = 1.0, n: int = 1024) -> float:
    """The CPU's fp32 matrix product rate with torch's threads, measured now (best of the runs)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """The device's peak FLOP/s for ``precision`` and where the figure comes from."""
    if device.type != "cuda":
        return cpu_peak_flops(), "measured fp32 matmul"
    name = torch.cuda.get_device_name(device)
    for key, peaks in PEAK_TFLOPS.items():
        if key in name:
            return peaks[precision] * 1e12, f"{key} datasheet {precision}"
    raise SystemExit(f"no peak FLOP/s for {name!r}: add it to PEAK_TFLOPS")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(task: Task, args, device: torch.device, precision: str, steps: int):
    """The loop a Hugging Face user writes (AdamW, linear schedule, clip at 1, autocast) around the
    same step, ready to run."""
    model = task.model_fn().to(device).train()
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-5)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / max(steps, 1)))
    resolved = resolve_precision(precision, device)
    scaler = torch.amp.GradScaler("cuda") if resolved == "fp16" else None
    batches = StepBatches(task.items, task.make_batch, seed=13, batch_size=args.batch_size)
    return lambda: _plain_steps(task, model, optimizer, schedule, scaler, batches, resolved, device, steps)


def _to(batch, device):
    if isinstance(batch, tuple):
        return tuple(_to(b, device) for b in batch)
    return {k: v.to(device) for k, v in batch.items()}


def _plain_steps(task, model, optimizer, schedule, scaler, batches, resolved, device, steps) -> None:
    backward = (lambda t: scaler.scale(t).backward()) if scaler else (lambda t: t.backward())
    for step in range(steps):
        with autocast(resolved, device):
            out = task.step(model, _to(batches[step], device), backward)
        float(out["loss"])  # the per-step read a plain loop logs
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
    """The project's Trainer over the same batches, its defaults plus ``options``, ready to run."""
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
        task.step,
        lambda m, out: None,
        train_args,
        folder / "ckpt",
        {},
        manual_backward=True,
    )
    return lambda: trainer.train(lambda m, d: None, folder / "train_log.csv")


def loop(task: Task, args, device, precision: str, folder: Path, options: dict | None, steps: int):
    """The plain loop (``options`` None) or the Trainer with ``options``, for ``steps`` steps."""
    if steps == 0:  # no warm-up (the Trainer's max_steps 0 would mean one epoch)
        return lambda: None
    if options is None:
        return plain_loop(task, args, device, precision, steps)
    return trainer_loop(task, args, device, precision, steps, folder, **options)


def measure(label: str, setup, task: Task, args, device: torch.device, peak: float) -> dict:
    """Run ``setup(warmup)()`` untimed, then time ``setup(steps)()`` (the model is built before
    the clock starts); tokens and FLOPs are those of the timed steps' batches. The peak memory
    counts the weights, the optimizer state and the activations of the timed run."""
    setup(args.warmup)()
    gc.collect()
    sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    run = setup(args.steps)
    sync(device)
    rss_exact = device.type != "cuda" and reset_peak_rss()
    started = time.perf_counter()
    run()
    sync(device)
    seconds = time.perf_counter() - started
    del run
    requested_mib = None
    if device.type == "cuda":
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
        # the peak of the bytes the tensors (and cuBLAS's workspaces) asked for: the allocated
        # peak counts whole blocks, the allocator's rounding included (memory.CUDA_ALLOCATED)
        requested = torch.cuda.memory_stats(device).get("requested_bytes.all.peak")
        requested_mib = None if requested is None else requested / 2**20
    else:
        peak_mib = status_kib("VmHWM") / 1024 if rss_exact else None
    batches = StepBatches(task.items, task.make_batch, seed=13, batch_size=args.batch_size)
    model = task.model_fn()
    n_tokens, flops = 0, 0.0
    for s in range(args.steps):
        batch = batches[s]
        n_tokens += task.tokens(batch)
        flops += task.flops(model, batch)
    row = {
        "label": label,
        "tokens_per_s": n_tokens / seconds,
        "tflops": flops / seconds / 1e12,
        "mfu": flops / seconds / peak,
        "seconds": seconds,
        "tokens": n_tokens,
        "peak_mib": peak_mib,
        "requested_mib": requested_mib,
    }
    mem = f", peak {row['peak_mib']:.0f} MiB" if row["peak_mib"] is not None else ""
    mem += f" ({requested_mib:.0f} requested)" if requested_mib is not None else ""
    print(
        f"  {label}: {row['tokens_per_s']:.0f} tokens/s, {row['tflops']:.3f} TFLOP/s, MFU {row['mfu']:.1%} "
        f"({seconds:.2f} s, {n_tokens} tokens{mem})",
        flush=True,
    )
    return row


def estimate_mib(task: str, args, shape: EncoderShape, gpu: bool, precision: str, chunk: int) -> float:
    """The stage's memory estimate of ``task``'s step (``_common.stage_estimate``), a gradient
    cache in chunks of ``chunk``: on a GPU without the allowance for the process (host memory;
    comparable with the peak allocated), on a CPU with it (comparable with the process's peak
    resident set)."""
    estimate = stage_estimate(
        task, shape, args.batch_size, args.group_size, args.seq_len, precision, gpu, chunk
    )
    return (estimate - (PROCESS_BYTES if gpu else 0)) / 2**20


@contextlib.contextmanager
def chunks_encoded() -> Iterator[list[int]]:
    """Record the chunk each gradient-cache step in the block encodes: what
    ``dprflow.training.steps.fitting_chunk`` answers (the configured ``chunk_size``, or under the
    Trainer's ``training.chunk_from_memory`` the largest that fits the GPU), so that a row's
    estimate is the one of the step that ran."""
    chosen: list[int] = []
    fitting_chunk = training_steps.fitting_chunk

    def recorded(*args, **kwargs) -> int:
        chunk = fitting_chunk(*args, **kwargs)
        chosen.append(chunk)
        return chunk

    training_steps.fitting_chunk = recorded
    try:
        yield chosen
    finally:
        training_steps.fitting_chunk = fitting_chunk


def batch_label(task: str, args) -> str:
    """The ``batch`` column: ``B``, or ``BxG`` for the retriever's queries with their passages and
    the bare model over those passages."""
    grouped = task.startswith("retriever") or task == "bert_passages"
    return f"{args.batch_size}x{args.group_size}" if grouped else str(args.batch_size)


def slug(name: str) -> str:
    """A file-name form of a device name: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def csv_path(folder: Path, device: str, today: datetime.date | None = None) -> Path:
    """``folder/<date>-<device slug>.csv``."""
    return Path(folder) / f"{(today or datetime.date.today()).isoformat()}-{slug(device)}.csv"


def write_csv(path: Path, rows: list[dict], versions: dict[str, str], args) -> Path:
    """The table's rows as CSV (:data:`CSV_COLUMNS`), written to a temporary file and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            peak = row["peak_mib"]
            writer.writerow(
                {
                    **versions,
                    "step": row["task"],
                    "loop": row["loop"],
                    "batch": batch_label(row["task"], args),
                    "length": args.seq_len,
                    "tokens_per_s": round(row["tokens_per_s"], 1),
                    "mfu": round(row["mfu"], 4),
                    "peak_mib": "" if peak is None else round(peak, 1),
                    "estimate_mib": round(row["estimate_mib"], 1),
                    "estimate_over_peak": "" if not peak else round(row["estimate_mib"] / peak, 3),
                }
            )
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--steps", type=int, default=0, help="timed steps (0: 6 on CPU, 30 on GPU)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=0, help="0: 8 on CPU, 64 on GPU")
    parser.add_argument(
        "--group-size", type=int, default=0, help="passages per query (0: 4 on CPU, 8 on GPU)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=0, help="tokens per sequence (0: 64 on CPU, 128 on GPU)"
    )
    parser.add_argument("--chunk-size", type=int, default=0, help="gradient cache chunk (0: batch / 4)")
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of each variant, interleaved; the best counts"
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["plain", "trainer"],
        choices=["plain", "trainer", "compile", "checkpointing", "packed"],
        help="loops to measure: the plain loop, the Trainer (defaults), with torch.compile, with "
        "gradient checkpointing, with padding-free steps (packed: the tasks of PACKED_TASKS only)",
    )
    parser.add_argument(
        "--compile-tasks",
        nargs="*",
        default=None,
        choices=list(TASKS),
        help="the tasks the compile variant runs for (default: every task measured)",
    )
    parser.add_argument(
        "--texts", action="store_true", help="retriever: tokenize each batch's texts in the step (not ids)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (CPU runs)")
    parser.add_argument("--no-write", action="store_true", help="print only, write no results/bench files")
    parser.add_argument(
        "--csv-dir", type=Path, default=None, help="also write the table to DIR/<date>-<device>.csv"
    )
    args = parser.parse_args(argv)
    quiet_hugging_face()
    # Each row loads its models from a folder: no per-load report of the heads left out (45 tables
    # in one `make gpu-check`).
    transformers.logging.set_verbosity_error()
    if args.device == "cpu":
        # The Trainer takes a GPU whenever one is visible: hide them for a CPU measurement.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if torch.cuda.is_available():
            parser.error("--device cpu: CUDA was initialised before the GPUs could be hidden")
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    args.steps = args.steps or (30 if gpu else 6)
    args.batch_size = args.batch_size or (64 if gpu else 8)
    args.group_size = args.group_size or (8 if gpu else 4)
    args.seq_len = args.seq_len or (128 if gpu else 64)
    args.chunk_size = args.chunk_size or max(1, args.batch_size // 4)
    if not gpu:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if gpu else f"CPU, {torch.get_num_threads()} torch threads"
    print(
        f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}; model "
        f"{args.model}; batch {args.batch_size}, group {args.group_size}, {args.seq_len} tokens, "
        f"{args.steps} timed steps",
        flush=True,
    )
    precision = resolve_precision("auto", device)  # bf16 where native, else fp16; fp32 on a CPU
    peak, peak_source = peak_flops(device, precision)
    print(f"peak: {peak / 1e12:.3f} TFLOP/s ({peak_source})", flush=True)
    all_variants = {
        "plain": None,
        "trainer": {},
        "compile": {"compile": True},
        "checkpointing": {"gradient_checkpointing": True},
        "packed": {"attention": "packed"},  # padding-free steps (dprflow.models.packed)
    }
    variants = [(label, all_variants[label]) for label in args.variants]
    versions = {
        "device": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda or "",
    }
    table = csv_path(args.csv_dir, name) if args.csv_dir else None
    shape = EncoderShape.of(
        BertConfig(vocab_size=WORDS + 5, max_position_embeddings=512, **MODELS[args.model])
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer = make_tokenizer(folder)
        for task_name in args.tasks:
            task = Task(task_name, args, tokenizer, folder)
            print(f"{task_name}:", flush=True)
            # Repeats interleave the variants, and the best of each is kept: on a shared
            # machine the other load only ever slows a run down.
            best: dict[str, dict] = {}
            for _ in range(args.repeats):
                for label, options in variants:
                    if (
                        label == "compile"
                        and args.compile_tasks is not None
                        and task_name not in args.compile_tasks
                    ) or (label == "packed" and task_name not in PACKED_TASKS):
                        continue
                    setup = functools.partial(loop, task, args, device, precision, folder, options)
                    with chunks_encoded() as chunks:
                        row = measure(f"{task_name}_{label}_{precision}", setup, task, args, device, peak)
                    # the chunk the steps encoded (warm-up and timed alike: same model, same budget)
                    chunk = max(chunks, default=0) or task.chunk_size
                    if task.chunk_size:
                        print(f"  {row['label']}: gradient cache in chunks of {chunk}", flush=True)
                    if label not in best or row["tokens_per_s"] > best[label]["tokens_per_s"]:
                        best[label] = {
                            **row,
                            "task": task_name,
                            "loop": label,
                            "precision": precision,
                            "chunk": chunk,
                            "estimate_mib": estimate_mib(task_name, args, shape, gpu, precision, chunk),
                        }
            rows += best.values()
            if table:
                write_csv(table, rows, versions, args)
    print()
    print(
        f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}, Python "
        f"{sys.version.split()[0]}; model {args.model}, {precision}; batch {args.batch_size}, group "
        f"{args.group_size}, {args.seq_len} tokens, {args.steps} timed steps"
    )
    print(
        "| step | loop | precision | tokens/s | TFLOP/s | MFU | vs plain | peak MiB | estimate MiB "
        "| estimate / peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        plain = next(  # the plain loop, else the first variant
            r for r in rows if r["task"] == row["task"] and r["loop"] in ("plain", variants[0][0])
        )
        ratio = row["tokens_per_s"] / plain["tokens_per_s"]
        mem = "" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}"
        over = f"{row['estimate_mib'] / row['peak_mib']:.2f}" if row["peak_mib"] else ""
        print(
            f"| {row['task']} | {row['loop']} | {row['precision']} | {row['tokens_per_s']:.0f} | "
            f"{row['tflops']:.3f} | {row['mfu']:.1%} | {ratio:.2f} | {mem} | {row['estimate_mib']:.0f} | "
            f"{over} |"
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
                mfu=round(row["mfu"], 4),
                tflops=round(row["tflops"], 4),
                peak_tflops=round(peak / 1e12, 3),
                peak_source=peak_source,
                peak_mib=None if row["peak_mib"] is None else round(row["peak_mib"], 1),
                device=name,
                torch=torch.__version__,
                transformers=transformers.__version__,
                batch_size=args.batch_size,
                group_size=args.group_size,
                seq_len=args.seq_len,
            )
    if table:
        print(f"csv: {table}", flush=True)
    return 0 if all(math.isfinite(r["tokens_per_s"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
