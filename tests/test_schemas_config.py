"""The table schemas (checked reads and atomic writes) and the config validation."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dprflow.config import ConfigError, load_config, validate_config
from dprflow.data.schemas import SchemaError, atomic_path, read_table, write_table

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
    has no ../shared/collections); the path check itself: tests/test_robustness.py."""
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
