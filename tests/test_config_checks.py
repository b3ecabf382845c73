"""Config mistakes caught when the DAG is built, before any job runs, each named by its key
(issues 18, 22, 34): values out of range or inconsistent, settings that name a missing file or
model, a malformed YAML file; `make run` checks the config before Snakemake reads it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from config_edits import config_problems
from config_edits import set_key as _set
from dry_runs import failed_dry_run

ROOT = Path(__file__).resolve().parents[1]


def test_default_config_passes_every_check():
    assert config_problems(lambda c: None) == ""


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


def test_an_unknown_baseline_stops_the_dag_build(tmp_path):
    printed = failed_dry_run(tmp_path, "evaluation={'baseline': 'bm26'}")
    assert "evaluation.baseline = 'bm26' is not a row of this run's comparison" in printed
    assert "none/zeroshot" in printed


# ---- every setting that names a file is an input of the rules that read it -----------------------


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


# ---- issue 22: checks that let bad values through ------------------------------------------------


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


def test_the_reranker_length_is_checked_only_where_a_row_reranks():
    """finetune.reranker.max_length feeds the reranker only: a config whose rows stop at retriever
    2 may leave it above the model's positions (the MLM base's 160), one that reranks may not."""
    too_long = _set("finetune.reranker.max_length", 513)
    retrievers = config_problems(lambda c: (too_long(c), _set("finetune.stages", ["r1", "r2"])(c)))
    assert retrievers == ""
    one_row = config_problems(
        lambda c: (
            too_long(c),
            _set("finetune.stages", ["r1"])(c),
            _set("finetune.stages_of", {"none": ["r1", "r2", "rerank"]})(c),
        )
    )
    assert "finetune.reranker.max_length asks for 513 tokens" in one_row
