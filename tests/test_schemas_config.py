"""The table schemas (checked reads and atomic writes) and the config validation."""

from __future__ import annotations

import copy
import os
import re
import stat
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dprflow.config import ConfigError, load_config, validate_config
from dprflow.data.schemas import SchemaError, read_table, write_table
from dprflow.files import atomic_path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema.yaml"


def test_write_read_round_trip(tmp_path):
    df = pd.DataFrame({"query_id": ["q1"], "doc_id": ["d1"], "relevance": [2]})
    write_table(df, tmp_path / "qrels.parquet", "qrels")
    back = read_table(tmp_path / "qrels.parquet", "qrels")
    assert back.to_dict("records") == [{"query_id": "q1", "doc_id": "d1", "relevance": 2}]


def test_wrong_column_type_names_file_and_column(tmp_path):
    df = pd.DataFrame({"query_id": ["q1"], "doc_id": ["d1"], "relevance": ["high"]})
    with pytest.raises(SchemaError, match=r"qrels\.parquet.*'relevance'"):
        write_table(df, tmp_path / "qrels.parquet", "qrels")
    assert not list(tmp_path.iterdir()), "a failed write must leave nothing behind"


def test_read_rejects_a_table_of_another_type(tmp_path):
    pd.DataFrame({"query_id": ["q1"], "doc_id": ["d1"], "relevance": [1.5]}).to_parquet(
        tmp_path / "x.parquet"
    )
    with pytest.raises(SchemaError, match=r"x\.parquet: column 'relevance' has type double"):
        read_table(tmp_path / "x.parquet", "qrels")


def test_null_value_names_the_row(tmp_path):
    df = pd.DataFrame({"query_id": ["q1", None], "text": ["a", "b"], "split": ["train", "test"]})
    with pytest.raises(SchemaError, match="null at row 1"):
        write_table(df, tmp_path / "q.parquet", "queries")


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "out.txt") as tmp:
        tmp.write_text("half")
        raise RuntimeError("boom")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_outputs_follow_the_umask(tmp_path, umask, mode):
    """tempfile stages files with mode 0600; the renamed output gets the umask's mode instead."""
    old = os.umask(umask)
    try:
        write_table(
            pd.DataFrame({"query_id": ["q"], "doc_id": ["d"], "relevance": [1]}),
            tmp_path / "q.parquet",
            "qrels",
        )
        with atomic_path(tmp_path / "run.trec") as tmp:
            tmp.write_text("q Q0 d 1 1.0 x\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "q.parquet").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "run.trec").stat().st_mode) == mode


def test_default_config_is_valid_and_gets_defaults():
    config = load_config(ROOT / "config" / "config.yaml", SCHEMA)
    assert config["bm25"]["k1"] == 0.9
    assert config["finetune"]["reranker"]["weight_decay"] == 0.01  # filled from the schema


def test_example_configs_are_valid():
    """Schema and values of every example config, without the data its paths name (a fresh clone
    has no ../shared/collections); the path check itself: tests/test_config_checks.py."""
    examples = sorted((ROOT / "config" / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_config(path, SCHEMA, check_paths=False)


def test_an_example_config_passes_every_check_where_its_data_exists(tmp_path):
    """cranfield.yaml with its collection path pointed at a BEIR folder that exists."""
    import copy

    config = yaml.safe_load((ROOT / "config" / "examples" / "cranfield.yaml").read_text())
    (tmp_path / "qrels").mkdir()
    for split in ("train", "test"):
        (tmp_path / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n")
    moved = copy.deepcopy(config)
    moved["collections"]["cranfield"]["path"] = str(tmp_path)
    validate_config(moved, SCHEMA)
    config["collections"]["cranfield"]["path"] = str(tmp_path / "absent")
    with pytest.raises(ConfigError, match=r"collections\.cranfield\.path = '.*absent' does not exist"):
        validate_config(config, SCHEMA)


def test_unknown_key_is_named_with_the_allowed_ones():
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["bm25"]["k3"] = 1.2
    with pytest.raises(
        ConfigError, match=r"unknown config key\(s\) \['k3'\] at bm25; allowed: b, heap_mb, hits, k1"
    ):
        validate_config(config, SCHEMA)


def test_unknown_value_lists_the_allowed_ones():
    config = {"collections": {"c": {"source": "trec"}}}
    with pytest.raises(
        ConfigError, match=r"collections\.c\.source = 'trec' is not allowed; allowed: embedded, beir"
    ):
        validate_config(config, SCHEMA)


def test_source_specific_keys_are_checked():
    with pytest.raises(ConfigError, match="source 'beir' needs the key 'path'"):
        validate_config({"collections": {"c": {"source": "beir"}}}, SCHEMA)


def beir_stub(root: Path, splits=("train", "test")) -> Path:
    """An empty BEIR folder declaring ``splits`` (the config checks read only qrels/*.tsv)."""
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        (root / name).write_text("")
    for split in splits:
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n")
    return root


def transfer_config(tmp_path, **cisi) -> dict:
    return {
        "collections": {
            "cranfield": {"source": "beir", "path": str(beir_stub(tmp_path / "cranfield"))},
            "cisi": {"source": "beir", "path": str(beir_stub(tmp_path / "cisi", ("test",))), **cisi},
        }
    }


def test_an_evaluate_only_collection_needs_no_training_split(tmp_path):
    with pytest.raises(ConfigError, match=r"collections\.cisi\.train_split = 'train' is not a split"):
        validate_config(transfer_config(tmp_path), SCHEMA)
    config = validate_config(transfer_config(tmp_path, evaluate_only=True), SCHEMA)
    assert config["collections"]["cisi"]["evaluate_only"] is True
    assert config["collections"]["cranfield"]["evaluate_on"] == []
    with pytest.raises(ConfigError, match=r"collections\.cisi\.eval_split = 'dev' is not a split"):
        validate_config(transfer_config(tmp_path / "dev", evaluate_only=True, eval_split="dev"), SCHEMA)


@pytest.mark.parametrize(
    "evaluate_on, message",
    [
        (
            ["trec-covid"],
            r"collections\.cranfield\.evaluate_on\[0\] = 'trec-covid' is not a collection of this config; its collections: cranfield, cisi",
        ),
        (["cranfield"], r"collections\.cranfield\.evaluate_on\[0\] = 'cranfield' is the collection itself"),
    ],
)
def test_evaluate_on_names_other_collections(tmp_path, evaluate_on, message):
    config = transfer_config(tmp_path, evaluate_only=True)
    config["collections"]["cranfield"]["evaluate_on"] = evaluate_on
    with pytest.raises(ConfigError, match=message):
        validate_config(config, SCHEMA)


def test_an_evaluate_only_collection_transfers_nothing(tmp_path):
    config = transfer_config(tmp_path, evaluate_only=True, evaluate_on=["cranfield"])
    with pytest.raises(
        ConfigError, match=r"collections\.cisi\.evaluate_on: collection 'cisi' is evaluate_only"
    ):
        validate_config(config, SCHEMA)


def test_reference_models_are_named_and_checked(tmp_path):
    from dprflow.config import reference_models

    (tmp_path / "my model.v2").mkdir()
    (tmp_path / "my model.v2" / "config.json").write_text('{"model_type": "bert"}')
    config = {
        "collections": {"c": {"source": "embedded"}},
        "model": {
            "references": [
                "BAAI/bge-small-en-v1.5",
                str(tmp_path / "my model.v2"),
                {
                    "model": "facebook/contriever",
                    "name": "contriever",
                    "pooling": "mean",
                    "similarity": "dot",
                },
            ]
        },
    }
    refs = reference_models(validate_config(config, SCHEMA))
    assert refs == {
        "ref-bge-small-en-v1-5": {"model": "BAAI/bge-small-en-v1.5", "pooling": None, "similarity": None},
        "ref-my-model-v2": {"model": str(tmp_path / "my model.v2"), "pooling": None, "similarity": None},
        "ref-contriever": {"model": "facebook/contriever", "pooling": "mean", "similarity": "dot"},
    }
    config["model"]["references"].append("other/bge-small-en-v1.5")
    with pytest.raises(
        ConfigError,
        match=r"model\.references\[3\] \('other/bge-small-en-v1\.5'\) and an earlier reference \('BAAI/bge-small-en-v1\.5'\) are both named 'ref-bge-small-en-v1-5'",
    ):
        validate_config(config, SCHEMA)
    config["model"]["references"] = [str(tmp_path / "missing")]
    with pytest.raises(ConfigError, match=r"model\.references\[0\] = '.*missing' does not exist"):
        validate_config(config, SCHEMA)
    config["model"]["references"] = [{"model": "x/y", "pooling": "max"}]
    with pytest.raises(ConfigError, match=r"model\.references\[0\]"):
        validate_config(config, SCHEMA)


def test_a_setting_of_two_forms_names_both():
    """Issue 41 item 4b: training.pad_to_multiple_of: "8" (a string) was refused with "allowed:
    auto", as if integers were not allowed."""
    config = {"collections": {"c": {"source": "embedded"}}, "training": {"pad_to_multiple_of": "8"}}
    with pytest.raises(ConfigError) as caught:
        validate_config(config, SCHEMA)
    assert (
        "config value training.pad_to_multiple_of = '8' must be 'auto' or an integer >= 0 "
        "(a string: write 8 without quotes)"
    ) in str(caught.value)
    config["training"]["pad_to_multiple_of"] = -8
    with pytest.raises(ConfigError, match=r"= -8 must be 'auto' or an integer >= 0$"):
        validate_config(config, SCHEMA)
    for good in ("auto", 0, 8):
        config["training"]["pad_to_multiple_of"] = good
        assert validate_config(config, SCHEMA)["training"]["pad_to_multiple_of"] == good


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        (
            ("finetune", "retriever"),
            "batch_size",
            4.0,
            r"finetune\.retriever\.batch_size = 4\.0 must be an integer \(write 4, without the decimal point\)",
        ),
        (("bm25",), "hits", 10.5, r"bm25\.hits = 10\.5 must be an integer$"),
        (
            ("finetune", "distill"),
            "max_queries",
            2.0,
            r"finetune\.distill\.max_queries = 2\.0 must be an integer or null",
        ),
        (
            ("finetune",),
            "nb_recall_n",
            [50, 100.0],
            r"finetune\.nb_recall_n\[1\] = 100\.0 must be an integer",
        ),
        (
            ("training",),
            "pad_to_multiple_of",
            8.0,
            r"training\.pad_to_multiple_of = 8\.0 must be 'auto' or an integer >= 0 \(write 8,",
        ),
        (
            ("bm25",),
            "k1",
            "1e-4",
            r"bm25\.k1 = '1e-4' must be a number \(a string: YAML reads 1e-4 as text; write 1\.0e-4\)",
        ),
    ],
    ids=["batch size 4.0", "hits 10.5", "integer or null", "list item", "auto or integer", "number as text"],
)
def test_a_float_where_the_schema_says_integer_is_refused_naming_the_key(section, key, value, message):
    """Issue 41 item 4c: finetune.retriever.batch_size: 4.0 passed the schema (JSON Schema counts
    4.0 as an integer) and failed at the first training job naming the flag --batch-size; every
    integer of the schema now refuses floats when the config is checked."""
    config = {"collections": {"c": {"source": "embedded"}}}
    node = config
    for part in section:
        node = node.setdefault(part, {})
    node[key] = value
    with pytest.raises(ConfigError, match=message):
        validate_config(config, SCHEMA)


def test_every_integer_of_the_schema_refuses_a_float():
    """Generic, not one key: each key the schema types integer (alone, or with null) refuses its
    default plus 0.0 as a float and takes it as an int."""
    schema = yaml.safe_load(SCHEMA.read_text())
    keys = []

    def walk(node, path):
        for name, sub in node.get("properties", {}).items():
            kind = sub.get("type")
            kinds = [kind] if isinstance(kind, str) else kind or []
            if "integer" in kinds and isinstance(sub.get("default"), int):
                keys.append((*path, name))
            if sub.get("type") == "object":
                walk(sub, (*path, name))

    walk(schema, ())
    assert len(keys) > 50 and ("finetune", "retriever", "batch_size") in keys
    for key in keys:
        config = {"collections": {"c": {"source": "embedded"}}}
        node = config
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = float(_default(schema, key))
        with pytest.raises(ConfigError, match=rf"{re.escape('.'.join(key))} = .* must be an integer"):
            validate_config(config, SCHEMA)


def _default(schema: dict, key: tuple) -> int:
    node = schema
    for part in key:
        node = node["properties"][part]
    return node["default"]


def test_training_qrels_judging_nothing_relevant_are_refused_with_the_config(tmp_path):
    """Issue 41 item 4d: a train split whose qrels all score 0 was refused by the first training job,
    after 6 jobs had run (ingest, passages, BM25, negatives, ...); it is now refused when the config
    is checked, naming the key and the file (read up to its first relevant judgement)."""
    root = beir_stub(tmp_path / "c")
    train = root / "qrels" / "train.tsv"
    train.write_text("query-id\tcorpus-id\tscore\nq1\td1\t0\nq2\td2\t0\nq2\td3\t-1\n")
    config = {"collections": {"c": {"source": "beir", "path": str(root)}}}
    with pytest.raises(ConfigError) as caught:
        validate_config(copy.deepcopy(config), SCHEMA)
    assert (
        f"collections.c.train_split = 'train': {train} judges no passage relevant (its 3 judgements "
        "all score 0 or less)"
    ) in str(caught.value)
    validate_config(copy.deepcopy(config), SCHEMA, check_paths=False)  # a config for another machine
    evaluate_only = copy.deepcopy(config)
    evaluate_only["collections"]["c"]["evaluate_only"] = True  # nothing trains on it
    validate_config(evaluate_only, SCHEMA)
    train.write_text(train.read_text() + "q3\td1\t1\n")
    validate_config(copy.deepcopy(config), SCHEMA)
