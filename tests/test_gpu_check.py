"""``make gpu-check`` runs on a stock PyTorch GPU image (torch, transformers, pandas, pyarrow,
safetensors, pytest): its whole path, tests/test_gpu.py and every step type of the throughput
benchmark, runs on the CPU here with the packages such an image lacks blocked (a
``sitecustomize`` sets them to ``None`` in ``sys.modules``, so that importing one fails and
``importlib.util.find_spec`` says it is not installed, as on that image)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What `make setup` installs beside the stock image's packages (and the workflow imports).
BLOCKED = (
    "snakemake",
    "faiss",
    "pyserini",
    "jnius",
    "ir_measures",
    "ir_datasets",
    "sentence_transformers",
    "matplotlib",
    "scipy",
    "sklearn",
    "ranx",
    "jsonschema",
    "numba",
    "psutil",
    "xdist",
)


def test_make_gpu_check_needs_only_a_stock_pytorch_image(tmp_path):
    # --no-print-directory: under `make test` (a make inside make) the child prints its folder.
    make = subprocess.run(
        ["make", "--no-print-directory", "-n", "gpu-check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert make.stdout.strip() == "PYTHONPATH=src python3 scripts/gpu_check.py"  # no .venv, no make setup
    (tmp_path / "sitecustomize.py").write_text(
        f"import sys\n\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT / 'src'}",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # installed plugins (xdist) are not on that image
    }
    probe = subprocess.run([sys.executable, "-c", "import scipy"], env=env, capture_output=True, text=True)
    assert probe.returncode == 1 and "scipy" in probe.stderr  # the block holds
    # Every module the benchmark imports is imported whatever the tasks; these three run the steps
    # the others run too (the bi-encoder and coCondenser steps, the gradient cache, MoCo).
    tasks = ["retriever_cache", "cocondenser_cache", "contriever"]
    command = [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--model", "micro", "--steps", "1"]
    command += ["--tasks", *tasks]
    small = ["--", "--batch-size", "2", "--group-size", "2", "--seq-len", "16", "--chunk-size", "1"]
    done = subprocess.run(
        [*command, "--warmup", "0", "--compile-tasks", *small],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "gpu-check: tests/test_gpu.py exit 0" in out and "benchmark exit 0" in out
    assert "skipped" in out  # the GPU tests were collected (imported) and skip on the CPU
    for task in tasks:
        assert f"| {task} | plain |" in out and f"| {task} | trainer |" in out, task
    assert (
        "| step | loop | precision | tokens/s | TFLOP/s | MFU | vs plain | peak MiB | estimate MiB |" in out
    )
