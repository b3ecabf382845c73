"""``make gpu-check``: the first thing to run on a new GPU machine or cluster (docs/clusters.md).

Needs only what a stock PyTorch GPU image holds (torch, transformers, pandas, pyarrow,
safetensors, pytest), not ``make setup``: it runs this checkout's ``src`` with the interpreter
it is started with. Two parts, each run to the end whatever the other gives:

1. ``tests/test_gpu.py``: a retriever stage in fp16 (loss scaler) and bf16 killed and resumed
   to the same weights, the memory check's GPU branch, the speed switches' loss and gradients
   on the GPU (TF32, inductor, fused AdamW), the gradient cache's chunk from the GPU's memory,
   the padding-free steps (varlen attention) against the padded ones, a retriever stage packed;
2. ``bench/bench_train_throughput.py`` on BERT-base in the GPU's precision: every step type
   (retriever, with the gradient cache, Condenser, coCondenser, with the cache, BMAE,
   Contriever MoCo, and the bare ``BertModel`` at the Condenser's and the retriever passages'
   shapes: the ceiling of the same batch shape) in the plain Hugging Face loop, the Trainer, and
   the Trainer with ``compile`` (for the retriever, the Condenser and the bare model), the
   Trainer with padding-free steps (``packed``: the retriever's and the (co)Condenser's), printed as
   one table: device, versions, tokens/s, MFU, peak and estimated memory. The table is also
   written as CSV to ``--out-dir`` (default bench/gpu/), named by date and device
   (``2026-11-27-nvidia-h100-80gb-hbm3.csv``; columns: bench_train_throughput.CSV_COLUMNS), and
   its path printed last; the whole output beside it (``.log``: the rows' progress lines hold
   the GPU's requested peak besides the allocated one).

A cheaper rerun: ``--skip-tests`` runs the benchmark alone, ``--tasks`` and ``--variants`` some of
its rows. Exit status 0 when what ran passed. ``--device cpu --model micro`` runs the same path on a
CPU (the GPU tests skip), as ``tests/test_gpu_check.py`` does with the packages a stock image
lacks blocked.
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
VARIANTS = ["plain", "trainer", "compile", "packed"]
CSV_LINE = "csv: "  # how the benchmark names the CSV it wrote (its last line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="base", help="bench_train_throughput.py's --model")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile happens there)")
    parser.add_argument("--tasks", nargs="*", default=None, help="step types (default: all)")
    parser.add_argument(
        "--variants", nargs="*", default=VARIANTS, help=f"loops measured (default: {' '.join(VARIANTS)})"
    )
    parser.add_argument(
        "--compile-tasks",
        nargs="*",
        default=COMPILED,
        help=f"step types also run compiled (default: {COMPILED})",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=ROOT / "bench" / "gpu",
        help="folder of the table's CSV, <date>-<device>.csv (default: bench/gpu; on a lent GPU "
        "machine: $OUT)",
    )
    parser.add_argument("--skip-tests", action="store_true", help="the benchmark alone, no tests/test_gpu.py")
    parser.add_argument(
        "bench_args", nargs=argparse.REMAINDER, help="after --: more bench_train_throughput.py options"
    )
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "gpu-check.log"  # renamed after the table once the benchmark has named it
    bench = [sys.executable, "bench/bench_train_throughput.py", "--device", args.device, "--model", args.model,
             "--steps", str(args.steps), "--warmup", str(args.warmup), "--repeats", "1", "--no-write",
             "--csv-dir", str(out_dir), "--variants", *args.variants,
             "--compile-tasks", *args.compile_tasks]  # fmt: skip
    if args.tasks:
        bench += ["--tasks", *args.tasks]
    bench += [a for a in args.bench_args if a != "--"]
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as log_file:
        tests = None
        if not args.skip_tests:
            pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"]
            tests, _ = run_logged(pytest, env, log_file)
        tested = time.perf_counter() - started
        benched, said = run_logged(bench, env, log_file)
        table = said[-1][len(CSV_LINE) :].strip() if said else None
        ran = "tests skipped" if tests is None else f"tests/test_gpu.py exit {tests} ({tested:.0f} s)"
        summary = (
            f"gpu-check: {ran}, benchmark exit {benched} ({time.perf_counter() - started - tested:.0f} s)\n"
            f"gpu-check: table {table or 'not written'}\n"
        )
        log_file.write(summary)
    if table:
        log.replace(Path(table).with_suffix(".log"))
    print(summary, end="", flush=True)
    return 1 if tests or benched or not table else 0


def run_logged(command: list[str], env: dict[str, str], log_file) -> tuple[int, list[str]]:
    """Run ``command``, its output (stderr with stdout) passed through line by line as it comes
    and written to ``log_file``; return its exit status and the lines that start with
    :data:`CSV_LINE`."""
    found = []
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
            log_file.write(line)
            log_file.flush()
            if line.startswith(CSV_LINE):
                found.append(line)
    return child.returncode, found


if __name__ == "__main__":
    sys.exit(main())
