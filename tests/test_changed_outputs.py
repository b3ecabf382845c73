"""Outputs replaced, edited or emptied by hand after their stage wrote them are refused by the
next stage that reads them, naming the file and the stage that wrote it, and an export no stage
reads (a hub folder) is refused before planning (dprflow.provenance). One copy of the finished
tiny workflow (tests/tiny_workflow.py), two short Snakemake runs and two dry runs."""

from __future__ import annotations

import shutil

import pytest
from tiny_workflow import snakemake

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

ROW = "results/tiny/cocondenser/seed-13"


def read_logs(workdir) -> str:
    return "\n".join(p.read_text() for p in (workdir / "results" / "logs").rglob("*.log"))


def test_outputs_changed_by_hand_are_refused_by_what_reads_them(finished_run, tmp_path):
    workdir, config = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    row = copy / ROW
    # Another row's run, a valid run: the distilled retriever's row would report r2's figures.
    shutil.copyfile(row / "r2/run.parquet", row / "distill/run.parquet")
    # The negatives table of the same folder: the same schema as a run, scored 0 before.
    shutil.copyfile(row / "r2/negatives.parquet", row / "r2/run.parquet")
    # r2's run copied over r1's together with its record: the bytes match that record, but it
    # was written for r2/run.parquet.
    for name in ("run.parquet", "run.parquet.provenance.json"):
        shutil.copy2(row / "r2" / name, row / "r1" / name)
    metrics = [f"{ROW}/{stage}/metrics.parquet" for stage in ("r2", "distill", "r1")]
    scored = snakemake(copy, config, "--keep-going", *metrics)
    assert scored.returncode != 0
    logs = read_logs(copy)
    for path in ("r2/run.parquet", "distill/run.parquet"):
        assert f"{ROW}/{path}: changed since the 'search_dense' stage wrote it" in logs, scored.stderr[-3000:]
    expected = f"{ROW}/r1/run.parquet: its provenance record ({ROW}/r1/run.parquet.provenance.json) was "
    assert expected + f"written by the 'search_dense' stage for {ROW}/r2/run.parquet" in logs, scored.stderr[
        -3000:
    ]
    # r2's weights over r1's. Snakemake dates a folder output by its own stamp file, so this
    # reruns nothing by itself; an embedding shard removed makes the job that reads the model run.
    shutil.copyfile(row / "r2/model/model.safetensors", row / "r1/model/model.safetensors")
    (row / "r1/embeddings/shard_0.parquet").unlink()
    encoded = snakemake(copy, config, f"{ROW}/r1/embeddings/shard_0.parquet")
    assert encoded.returncode != 0
    logs = read_logs(copy)
    assert f"{ROW}/r1/model: changed since the 'train_retriever' stage wrote it" in logs, encoded.stderr[
        -3000:
    ]
    assert f"Remove it (rm -r '{ROW}/r1/model')" in logs
    # `rm -r r1/model && cp -r r2/model r1/model`: r2's record comes along inside the folder.
    shutil.rmtree(row / "r1/model")
    shutil.copytree(row / "r2/model", row / "r1/model")
    encoded = snakemake(copy, config, f"{ROW}/r1/embeddings/shard_0.parquet")
    assert encoded.returncode != 0
    logs = read_logs(copy)
    assert f"{ROW}/r1/model: its provenance record" in logs, encoded.stderr[-3000:]
    assert f"'train_retriever' stage for {ROW}/r2/model, not for this place" in logs

    # An export no stage reads, missing its weights: refused when the workflow plans.
    hub = row / "r2/hub"
    (hub / "model.safetensors").rename(tmp_path / "moved.safetensors")
    planned = snakemake(copy, config, "-n")
    assert planned.returncode != 0
    expected = f"{ROW}/r2/hub: changed since the 'export_model' stage wrote it (missing model.safetensors"
    assert expected in planned.stdout + planned.stderr
    (tmp_path / "moved.safetensors").rename(hub / "model.safetensors")  # put back: planning works again
    assert snakemake(copy, config, "-n").returncode == 0
