"""The tiny workflow run the end-to-end tests share: built once per test run, whichever process
asks first, and read by tests/test_workflow*.py in any of pytest-xdist's processes.

The run starts from a 2-layer BERT of hidden size 32 with random weights, saved as a
sentence-transformers folder (mean pooling, cosine, as the packaged MiniLM), with the packaged
MiniLM tokenizer: every stage runs its real code on real tokens, and each training or encoding job
costs its start-up rather than MiniLM's arithmetic (the whole run: about 40 jobs, whose `python -m`
calls are forked from the suite's job server, tests/job_server.py: 39 s instead of 116 s on 2
idle cores). The packaged model itself runs in `make run` and the stage tests.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake_cli import snakemake as run_snakemake

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TINY = ROOT / "tests" / "data" / "tiny_workflow.yaml"


def snakemake(workdir: Path, config: Path, *args: str, cores: int = 2) -> subprocess.CompletedProcess:
    cmd = [
        SNAKEMAKE,
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(config),
        "--cores",
        str(cores),
        *args,
    ]
    # Jobs run `python -m ...`: this interpreter's environment comes first, as in an activated venv.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # A dry run in this process; a run as a command, with no timeout a slow machine reaches (on two
    # busy cores the whole run takes a few minutes).
    return run_snakemake(cmd, env=env)


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> job count."""
    jobs = {}
    if "Job stats" not in result.stdout:
        return jobs
    table = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    for line in table.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m and m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def tiny_st_model(root: Path, prompts: dict[str, str] | None = None) -> Path:
    """A tiny sentence-transformers model (mean pooling, cosine), with ``prompts`` if given."""
    from conftest import save_tiny_bert

    from dprflow.models.st_format import ST_CONFIG_FILE, write_st_files

    save_tiny_bert(root, dropout=0.0, positions=512)  # the config's lengths checked as for BERT
    write_st_files(root, "mean", "cosine", dimension=32, max_seq_length=64)
    if prompts:
        config = json.loads((root / ST_CONFIG_FILE).read_text())
        (root / ST_CONFIG_FILE).write_text(json.dumps({**config, "prompts": prompts}))
    return root


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this test run that every xdist process sees (each has its own base folder
    inside the run's), removed with the run's temporary folders."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny workflow run to the end: ``(workdir, config)``. The first process to ask runs it
    under a file lock; the others wait for the lock and read what it left (the run, or why it
    failed)."""
    root = shared_folder(tmp_path_factory) / "tiny-workflow"
    root.mkdir(exist_ok=True)
    workdir, config = root / "work", root / "work" / "config.yaml"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "failed").exists():
            pytest.fail((root / "failed").read_text())
        if not (root / "done").exists():
            workdir.mkdir()
            settings = yaml.safe_load(TINY.read_text())
            settings["model"]["init"] = str(tiny_st_model(root / "tiny-init"))
            settings["finetune"]["encode_shards"] = 1
            config.write_text(yaml.safe_dump(settings))
            # The chain that ends in the distilled retriever's run (pre-training, r1, mining, r2,
            # the reranker's scores, distillation) is the run's longest: first in line, its jobs
            # leave the other rows to fill the second core (2 min 26 s -> 2 min 5 s, idle 2 cores).
            chain = "results/tiny/cocondenser/seed-13/distill/run.parquet"
            # Four cores on two: the model jobs ask for 2 threads each, but on this model a job's
            # time is Python, not arithmetic, so two of them side by side finish sooner (the
            # Snakemake run 64 s -> 51 s on 2 idle cores; each job's shell line is the same).
            result = snakemake(workdir, config, "--prioritize", chain, cores=4)
            if result.returncode != 0:
                logs = "\n".join(
                    f"== {p}\n{p.read_text()[-1500:]}" for p in (workdir / "results" / "logs").rglob("*.log")
                )
                (root / "failed").write_text(f"snakemake failed:\n{result.stderr[-4000:]}\n{logs[-6000:]}")
                pytest.fail((root / "failed").read_text())
            (root / "done").touch()
    return workdir, config
