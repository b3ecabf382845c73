"""Outputs replaced, edited or emptied by hand after their stage wrote them are refused by the
next stage that reads them, naming the file and the stage that wrote it, and an export no stage
reads (a hub folder) is refused before planning (dprflow.provenance). Each case runs Snakemake
on a copy of the finished tiny workflow (tests/tiny_workflow.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tiny_workflow import snakemake

pytestmark = pytest.mark.workflow

ROW = Path("results/tiny/cocondenser/seed-13")


@pytest.fixture
def copy(finished_run, tmp_path) -> tuple[Path, Path]:
    workdir, config = finished_run
    shutil.copytree(workdir, tmp_path / "copy", symlinks=True)
    return tmp_path / "copy", config


def failed_logs(workdir: Path) -> str:
    return "\n".join(p.read_text() for p in (workdir / "results" / "logs").rglob("*.log"))


def test_a_model_file_replaced_by_another_models_is_refused_by_the_stage_reading_it(copy):
    workdir, config = copy
    shutil.copyfile(
        workdir / ROW / "r2/model/model.safetensors", workdir / ROW / "r1/model/model.safetensors"
    )
    # Snakemake dates a folder output by its own stamp file: a file replaced inside reruns nothing
    # by itself, but any job that reads the folder later (here forced) must refuse it.
    result = snakemake(workdir, config, "--forcerun", "encode_corpus", str(ROW / "r1/metrics.parquet"))
    assert result.returncode != 0
    expected = f"{ROW / 'r1/model'}: changed since the 'train_retriever' stage wrote it"
    assert expected in failed_logs(workdir) + result.stderr
    assert "Remove it (rm -r" in failed_logs(workdir)


@pytest.mark.parametrize("source", ["r1/negatives.parquet", "r2/run.parquet"])
def test_a_run_replaced_by_another_table_is_not_scored(copy, source):
    """The negatives table shares the run's schema; another row's run is a valid run."""
    workdir, config = copy
    shutil.copyfile(workdir / ROW / source, workdir / ROW / "r1/run.parquet")
    result = snakemake(workdir, config, str(ROW / "r1/metrics.parquet"))
    assert result.returncode != 0
    assert f"{ROW / 'r1/run.parquet'}: changed since the" in failed_logs(workdir) + result.stderr


def test_a_hub_export_missing_its_weights_is_refused_before_planning(copy, tmp_path):
    workdir, config = copy
    hub = workdir / ROW / "r2/hub"
    (hub / "model.safetensors").rename(tmp_path / "moved.safetensors")
    result = snakemake(workdir, config, "-n")
    assert result.returncode != 0
    expected = f"{ROW / 'r2/hub'}: changed since the 'export_model' stage wrote it (missing model.safetensors"
    assert expected in result.stdout + result.stderr
    (tmp_path / "moved.safetensors").rename(hub / "model.safetensors")  # put back: planning works again
    assert snakemake(workdir, config, "-n").returncode == 0
