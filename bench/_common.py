"""Shared helpers of the benchmark scripts: every benchmark writes one small JSON file per figure.

A figure is ``{"name", "value", "unit", ...extra, "machine"}`` in ``results/bench/<name>.json`` (or
under ``$DPRFLOW_BENCH_DIR``), so results of different benchmarks and machines can be collected
with one glob. Scripts in ``bench/`` import this as ``from _common import write_bench``.

Also the training stages' memory estimate of a benchmark step type (:func:`stage_step`,
:func:`stage_estimate`), which ``bench_step_memory.py`` and ``bench_train_throughput.py`` both
compare with the peaks they measure (here, so that neither imports the other).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def bench_dir() -> Path:
    return Path(os.environ.get("DPRFLOW_BENCH_DIR") or ROOT / "results" / "bench")


def machine() -> dict[str, Any]:
    """What the figure depends on: CPU cores, and torch's intra-op threads when torch is installed."""
    info: dict[str, Any] = {"cores": os.cpu_count()}
    try:
        import torch
    except ImportError:
        info["torch_threads"] = None
    else:
        info["torch_threads"] = torch.get_num_threads()
    return info


def write_bench(name: str, value: float, unit: str, **extra: Any) -> Path:
    """Write ``results/bench/<name>.json`` with ``name``, ``value``, ``unit``, the extra keys and ``machine``.

    ``extra`` should hold at least ``n`` (items measured) and ``seconds`` (time taken); a
    ``machine`` key overrides the detected one. The file is replaced atomically. Returns its path.
    """
    if not name or "/" in name:
        raise ValueError(f"bench name must be a plain file stem, got {name!r}")
    record = {"name": name, "value": value, "unit": unit, **extra}
    record.setdefault("machine", machine())
    out = bench_dir() / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    shown = f"{value:.6g}" if isinstance(value, int | float) else repr(value)
    print(f"{name}: {shown} {unit} -> {out}")
    return out


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (``VmRSS``, ``VmHWM``: the peak resident set)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (``VmHWM``) of this process; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def stage_step(
    task: str, batch_size: int, group_size: int, seq_len: int, shape, precision: str, chunk: int = 0
):
    """The stage's own description of a step (``step_memory``) at this batch's shape (``task``:
    a step type of bench_train_throughput.py, ``_cache`` with a gradient cache of ``chunk``; the
    bare ``bert`` tasks: their sequences through the encoder)."""
    from dprflow.cli import parse_args
    from dprflow.training.memory import StepMemory

    if task.startswith("bert"):
        return StepMemory(((batch_size * (group_size if task == "bert_passages" else 1), seq_len),))
    from dprflow.stages import (
        pretrain_contriever,
        pretrain_corpus,
        pretrain_generic,
        pretrain_mae,
        train_retriever,
    )

    common = ["--init", "x", "--out", "o", "--checkpoint-dir", "c", "--precision", precision]
    cases = {
        # queries of at most 16 words + [CLS], [SEP] (bench_train_throughput.texts)
        "retriever": (train_retriever, ["--queries", "q", "--qrels", "r", "--passages", "p", "--negatives", "n",
                                        "--batch-size", batch_size, "--group-size", group_size,
                                        "--max-query-length", 18, "--max-passage-length", seq_len]),
        "condenser": (pretrain_generic, ["--corpus", "pydoc", "--batch-size", batch_size, "--max-length", seq_len]),
        # rows 2j and 2j + 1: two spans of document j
        "cocondenser": (pretrain_corpus, ["--passages", "p", "--batch-size", batch_size // 2, "--span-min", 1,
                                          "--span-max", seq_len - 2]),
        "mae": (pretrain_mae, ["--variant", "bmae", "--corpus", "pydoc", "--batch-size", batch_size,
                               "--max-length", seq_len]),
        "contriever": (pretrain_contriever, ["--passages", "p", "--batch-size", batch_size,
                                             "--max-doc-tokens", seq_len - 2, "--queue-size", 4096]),
    }  # fmt: skip
    module, extra = cases[task.removesuffix("_cache")]
    if task.endswith("_cache"):
        extra = [*extra, "--chunk-size", chunk]
    args = parse_args(module.Args, [str(a) for a in common + extra], module.__name__)
    return module.step_memory(args, shape, world=1)


def stage_estimate(
    task: str,
    shape,
    batch_size: int,
    group_size: int,
    seq_len: int,
    precision: str,
    cuda: bool,
    chunk: int = 0,
) -> int:
    """Bytes the stage estimates for ``task``'s step (:func:`stage_step`, a gradient cache in
    chunks of ``chunk``) in ``precision`` on a GPU (``cuda``) or a CPU, with the models' attention
    kernel (SDPA, transformers' default), as ``check_training_memory`` computes it; the allowance
    for the process itself (``PROCESS_BYTES``, host memory) included: callers comparing with a
    device's or the live tensors' peak subtract it."""
    from dprflow.training.memory import bytes_per_value, estimate_step_bytes, keeps_attention_scores

    step = stage_step(task, batch_size, group_size, seq_len, shape, precision, chunk)
    scores = keeps_attention_scores("sdpa", cuda)
    return estimate_step_bytes(shape, step, bytes_per_value(precision, cuda), scores, cuda)
