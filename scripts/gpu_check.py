"""``make gpu-check``: the first thing to run on a new GPU machine or cluster (docs/clusters.md).

Needs only what a stock PyTorch GPU image holds (torch, transformers, pandas, pyarrow,
safetensors, pytest), not ``make setup``: it runs this checkout's ``src`` with the interpreter
it is started with. Two parts, each run to the end whatever the other gives:

1. ``tests/test_gpu.py``: a retriever stage in fp16 (loss scaler) and bf16 killed and resumed
   to the same weights, the memory check's GPU branch, the speed switches' loss and gradients
   on the GPU (TF32, inductor, fused AdamW), the gradient cache's chunk from the GPU's memory;
2. ``bench/bench_train_throughput.py`` on BERT-base in the GPU's precision: every step type
   (retriever, with the gradient cache, Condenser, coCondenser, with the cache, BMAE,
   Contriever MoCo, and the bare ``BertModel`` at the Condenser's and the retriever passages'
   shapes: the ceiling of the same batch shape) in the plain Hugging Face loop, the Trainer, and
   the Trainer with ``compile`` (for the retriever, the Condenser and the bare model), printed as
   one table: device, versions, tokens/s, MFU, peak and estimated memory.

Exit status 0 when both pass. ``--device cpu --model micro`` runs the same path on a CPU (the GPU
tests skip), as ``tests/test_gpu_check.py`` does with the packages a stock image lacks blocked.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ["retriever", "condenser", "bert", "bert_passages"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="base", help="bench_train_throughput.py's --model")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile happens there)")
    parser.add_argument("--tasks", nargs="*", default=None, help="step types (default: all)")
    parser.add_argument(
        "--compile-tasks",
        nargs="*",
        default=COMPILED,
        help=f"step types also run compiled (default: {COMPILED})",
    )
    parser.add_argument(
        "bench_args", nargs=argparse.REMAINDER, help="after --: more bench_train_throughput.py options"
    )
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    started = time.perf_counter()
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"],
        cwd=ROOT,
        env=env,
    ).returncode
    tested = time.perf_counter() - started
    bench = [sys.executable, "bench/bench_train_throughput.py", "--device", args.device, "--model", args.model,
             "--steps", str(args.steps), "--warmup", str(args.warmup), "--repeats", "1", "--no-write",
             "--variants", "plain", "trainer", "compile", "--compile-tasks", *args.compile_tasks]  # fmt: skip
    if args.tasks:
        bench += ["--tasks", *args.tasks]
    bench += [a for a in args.bench_args if a != "--"]
    benched = subprocess.run(bench, cwd=ROOT, env=env).returncode
    print(
        f"gpu-check: tests/test_gpu.py exit {tests} ({tested:.0f} s), benchmark exit {benched} "
        f"({time.perf_counter() - started - tested:.0f} s)",
        flush=True,
    )
    return 1 if tests or benched else 0


if __name__ == "__main__":
    sys.exit(main())
