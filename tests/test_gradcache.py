"""Gradient cache: the chunked gradients equal the full-batch gradients of the same loss (float64),
with dropout on (random-state replay), for any chunk size including a ragged last chunk."""

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from dprflow.pretraining.condenser.model import (
    Condenser,
    cocondenser_contrastive_loss,
    cocondenser_loss,
)
from dprflow.pretraining.masking import IGNORE_INDEX, mask_tokens, special_tokens_mask
from dprflow.training import steps
from dprflow.training.gradcache import ChunkLoss, gradcache_step, split_batch
from dprflow.training.memory import activation_bytes, encoder_config, masked_per_row, row_activation_bytes
from dprflow.training.steps import cocondenser_gradcache_step, fitting_chunk

TINY = dict(vocab_size=100, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32)
PAD, CLS, SEP, MASK = 0, 1, 2, 3
CHUNK_SIZES = [1, 2, 3, 4, 6]  # 4: chunks of 4 and 2; 6: one chunk


@pytest.fixture(scope="module")
def condenser(tmp_path_factory):
    path = tmp_path_factory.mktemp("init")
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(**TINY)).save_pretrained(path)
    torch.manual_seed(1)
    return Condenser.from_pretrained(path).double()


@pytest.fixture(scope="module")
def batch():
    """6 spans (3 documents) of different lengths, so that the chunks hold different numbers of masks."""
    g = torch.Generator().manual_seed(0)
    lengths = [9, 4, 7, 9, 3, 8]
    ids = torch.full((6, 11), PAD)
    attention = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n + 1] = CLS, SEP
        ids[b, 1 : n + 1] = torch.randint(10, 100, (n,), generator=g)
        attention[b, : n + 2] = 1
    masked = mask_tokens(ids, special_tokens_mask(ids, attention, (PAD, CLS, SEP)), MASK, 100, g, p=0.3)
    assert len(set((masked.labels != IGNORE_INDEX).sum(dim=1).tolist())) > 1
    return {"input_ids": masked.input_ids, "attention_mask": attention, "labels": masked.labels}


def grads(model) -> dict[str, torch.Tensor]:
    out = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_same_grads(actual, expected, rel=1e-10):
    """Max relative difference per parameter below ``rel``. Gradients that are zero in exact
    arithmetic (the attention key bias: softmax ignores a per-row constant) are rounding noise,
    so the scale is at least 1e-6 of the largest gradient."""
    assert actual.keys() == expected.keys() and len(expected) > 50
    floor = 1e-6 * max(v.abs().max() for v in expected.values())
    for name, value in expected.items():
        scale = torch.maximum(value.abs().max(), floor)
        err = (actual[name] - value).abs().max() / scale
        assert err < rel, f"{name}: relative difference {err:.3g}"


def rep_fn(m, chunk):
    return m.encode(chunk["input_ids"], chunk["attention_mask"])


def masked_count(chunk):
    return int((chunk["labels"] != IGNORE_INDEX).sum())


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_cocondenser_step_equals_one_full_batch_backward(condenser, batch, chunk_size):
    """No dropout: the reference is one forward and backward of the whole batch (coCondenser eq. 7)."""
    condenser.eval().zero_grad(set_to_none=True)
    full = cocondenser_loss(condenser, batch)
    full.loss.backward()
    expected = grads(condenser)
    out = cocondenser_gradcache_step(condenser, batch, chunk_size)
    assert_same_grads(grads(condenser), expected)
    for name in ("loss", "contrastive", "head_mlm", "backbone_mlm"):
        assert getattr(out, name).item() == pytest.approx(getattr(full, name).item(), rel=1e-12), name
        assert not getattr(out, name).requires_grad


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_gradcache_replays_dropout(condenser, batch, chunk_size):
    """Dropout on: the reference forwards each chunk with a graph from the random state that the
    chunk's first (no-grad) forward saw, then back-propagates the full-batch loss once."""
    condenser.train().zero_grad(set_to_none=True)
    chunks = split_batch(batch, chunk_size)
    total = sum(masked_count(c) for c in chunks)
    weights = [masked_count(c) / total for c in chunks]

    torch.manual_seed(5)
    states = []
    with torch.no_grad():
        for chunk in chunks:  # the random state before each chunk's representation pass
            states.append(torch.get_rng_state())
            rep_fn(condenser, chunk)
    after_pass_one = torch.get_rng_state()
    cls, local = [], 0.0
    for chunk, state, weight in zip(chunks, states, weights, strict=True):
        torch.set_rng_state(state)
        out = condenser(**chunk)
        cls.append(out.cls)
        local = local + weight * out.loss
    reference = cocondenser_contrastive_loss(torch.cat(cls)) + local
    reference.backward()
    expected = grads(condenser)

    torch.manual_seed(5)
    result = gradcache_step(
        condenser,
        chunks,
        rep_fn,
        cocondenser_contrastive_loss,
        lambda m, c: (lambda o: ChunkLoss(o.cls, o.loss, {"head_mlm": o.head_mlm}))(m(**c)),
        chunk_weights=weights,
    )
    assert_same_grads(grads(condenser), expected)
    assert result.loss.item() == pytest.approx(reference.item(), rel=1e-12)
    assert result.reps.shape == (6, 16)
    assert torch.equal(torch.get_rng_state(), after_pass_one)  # pass 2 leaves the random state alone


def test_dropout_is_active_so_the_replay_matters(condenser, batch):
    condenser.train()
    with torch.no_grad():
        a, b = rep_fn(condenser, batch), rep_fn(condenser, batch)
        torch.manual_seed(3)
        c = rep_fn(condenser, batch)
        torch.manual_seed(3)
        d = rep_fn(condenser, batch)
    assert not torch.equal(a, b)
    assert torch.equal(c, d)


def test_pure_contrastive_default_weights_and_backward_fn():
    """A linear encoder, no local loss: gradients of L_co alone; backward_fn sees every surrogate."""
    torch.manual_seed(0)
    encoder = torch.nn.Linear(5, 3).double()
    x = torch.randn(6, 5, dtype=torch.float64)
    cocondenser_contrastive_loss(encoder(x)).backward()
    expected = grads(encoder)
    seen = []

    def backward(t):
        seen.append(t)
        (2.0 * t).backward()  # like a GradScaler with scale 2

    out = gradcache_step(
        encoder,
        list(x.split(4)),
        lambda m, c: m(c),
        cocondenser_contrastive_loss,
        lambda m, c: m(c),  # a plain tensor: representations only
        backward_fn=backward,
    )
    assert len(seen) == 2 and out.local_loss.item() == 0.0 and out.parts == {}
    actual = grads(encoder)
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], 2 * value, rtol=1e-12, atol=1e-14)


def test_split_batch_and_errors():
    batch = {"a": torch.arange(5), "b": torch.zeros(5, 2), "flag": True}
    chunks = split_batch(batch, 2)
    assert [c["a"].tolist() for c in chunks] == [[0, 1], [2, 3], [4]]
    assert all(c["flag"] is True for c in chunks)
    with pytest.raises(ValueError, match="disagree"):
        split_batch({"a": torch.zeros(3), "b": torch.zeros(4)}, 2)
    with pytest.raises(ValueError, match="chunk_size"):
        split_batch(batch, 0)
    encoder = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="representations"):
        gradcache_step(
            encoder,
            [torch.zeros(2, 2)],
            lambda m, c: m(c),
            lambda r: r.sum(),
            lambda m, c: m(torch.zeros(3, 2)),
        )


def test_the_chunk_from_memory_is_the_largest_that_fits_and_the_gradients_stay(condenser, batch):
    """training.chunk_from_memory: with a budget of k sequences' activations the cache encodes
    chunks of k (at least chunk_size, at most the batch); the gradients equal chunk_size's
    (dropout off: its masks are drawn per chunk, so other chunks draw other masks)."""
    condenser.eval()
    rows, length = batch["input_ids"].shape
    # every layer of the chunk's forward (encoder and head), one layer's gradients, the logits
    per_row = row_activation_bytes(condenser, length, 4, masked_per_row(0.15, length))
    assert per_row > activation_bytes(encoder_config(condenser), length, 4, layers=4)
    with steps.chunk_budget(4 * per_row + 1):
        assert fitting_chunk(condenser, 2, length, rows) == 4
        torch.manual_seed(5)
        cocondenser_gradcache_step(condenser, batch, chunk_size=2)
    chosen = grads(condenser)
    with steps.chunk_budget(100 * per_row):
        assert fitting_chunk(condenser, 2, length, rows) == rows
    with steps.chunk_budget(per_row):
        assert fitting_chunk(condenser, 2, length, rows) == 2  # never below chunk_size
    assert fitting_chunk(condenser, 2, length, rows) == 2  # no budget: chunk_size as given
    torch.manual_seed(5)
    cocondenser_gradcache_step(condenser, batch, chunk_size=2)
    condenser.train()
    assert_same_grads(chosen, grads(condenser))
