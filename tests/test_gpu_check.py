"""``make gpu-check`` runs on a stock PyTorch GPU image (torch, transformers, pandas, pyarrow,
safetensors, pytest): its whole path, tests/test_gpu.py and every step type of the throughput
benchmark, runs on the CPU here with the packages such an image lacks blocked (a
``sitecustomize`` sets them to ``None`` in ``sys.modules``, so that importing one fails and
``importlib.util.find_spec`` says it is not installed, as on that image), and its table comes back
as CSV, one row per benchmark row."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The CSV's columns, as bench_train_throughput.CSV_COLUMNS (written out: the test reads the file
# as a user would, without the benchmark's module).
COLUMNS = (
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


def stock_image_env(folder: Path) -> dict[str, str]:
    """The environment of a stock PyTorch image on this machine: the packages it lacks blocked (a
    ``sitecustomize`` in ``folder``), no GPU, no pytest plugins."""
    (folder / "sitecustomize.py").write_text(
        f"import sys\n\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n"
    )
    return {
        **os.environ,
        "PYTHONPATH": f"{folder}{os.pathsep}{ROOT / 'src'}",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # installed plugins (xdist) are not on that image
    }


@pytest.mark.slow
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
    env = stock_image_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import scipy"], env=env, capture_output=True, text=True)
    assert probe.returncode == 1 and "scipy" in probe.stderr  # the block holds
    # Every module the benchmark imports is imported whatever the tasks; these three run the steps
    # the others run too (the bi-encoder and coCondenser steps, the gradient cache, MoCo).
    tasks = ["retriever_cache", "cocondenser_cache", "contriever"]
    command = [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--model", "micro", "--steps", "1"]
    command += ["--tasks", *tasks, "--out-dir", str(tmp_path / "gpu")]
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
    header = "| step | loop | precision | tokens/s | TFLOP/s | MFU | vs plain | peak MiB | estimate MiB |"
    assert header in out
    # The table as CSV, named by date and device, its path printed last; one row per table row.
    (table,) = (tmp_path / "gpu").glob("*.csv")
    assert out.rstrip().endswith(f"gpu-check: table {table}")
    log = table.with_suffix(".log").read_text()  # the whole output beside it: tests, rows, table
    assert "skipped" in log and header in log and log.rstrip().endswith(f"gpu-check: table {table}")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-cpu-\d+-torch-threads\.csv", table.name), table.name
    with table.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert reader.fieldnames == list(COLUMNS)
    printed = re.findall(r"^\| (\w+) \| (\w+) \| fp32 \|", out, flags=re.MULTILINE)
    assert [(r["step"], r["loop"]) for r in rows] == printed
    # the packed (padding-free) variant runs where the step has that path (PACKED_TASKS)
    packed = {"retriever_cache", "cocondenser_cache"}
    assert printed == [
        (task, loop)
        for task in tasks
        for loop in ("plain", "trainer", "packed")
        if loop != "packed" or task in packed
    ]
    for row in rows:
        assert row["device"].startswith("CPU, ") and row["torch"] and row["transformers"], row
        assert (
            row["batch"] == ("2x2" if row["step"].startswith("retriever") else "2") and row["length"] == "16"
        )
        assert float(row["tokens_per_s"]) > 0 and 0 < float(row["mfu"]) and float(row["estimate_mib"]) > 0
        if row["peak_mib"]:  # the resident set's peak, where the kernel lets it be reset
            ratio = float(row["estimate_mib"]) / float(row["peak_mib"])
            assert abs(float(row["estimate_over_peak"]) - ratio) < 2e-3, row


@pytest.mark.slow
def test_a_rerun_of_the_benchmark_alone_for_some_rows(tmp_path):
    """``--skip-tests`` with ``--tasks`` and ``--variants``: no tests/test_gpu.py, only the rows
    asked for, in the table and its CSV."""
    command = [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--model", "micro", "--steps", "1",
               "--warmup", "0", "--skip-tests", "--tasks", "contriever", "--variants", "trainer",
               "--out-dir", str(tmp_path / "rerun"), "--", "--batch-size", "2", "--seq-len", "16"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=stock_image_env(tmp_path), capture_output=True, text=True)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "gpu-check: tests skipped, benchmark exit 0" in out and "test_gpu.py" not in out
    (table,) = (tmp_path / "rerun").glob("*.csv")
    with table.open(newline="") as fh:
        assert [(r["step"], r["loop"]) for r in csv.DictReader(fh)] == [("contriever", "trainer")]
