"""The padding-free path (dprflow.models.packed) on a CPU: the packing, the choice of attention
kernel, and the retriever's and the Condenser's packed steps against their padded ones (loss and
every gradient), through the per-sequence reference of the packed attention. tests/test_gpu.py
checks the GPU kernel (varlen_attn) against the padded step in bf16."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertModel

from dprflow.finetuning.biencoder import BiEncoder, length_grouping_pays
from dprflow.finetuning.losses import contrastive_loss
from dprflow.models.packed import (
    Packing,
    attention_backend,
    check_packable,
    packed_states,
    set_packed,
    varlen_attention,
)
from dprflow.pretraining.condenser.model import Condenser, CondenserConfig
from dprflow.training.batches import StepBatches, split_rows, with_packing
from dprflow.training.speed import set_attention, to_device

MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])


def micro_config(**extra) -> BertConfig:
    return BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        **extra,
    )


def batch(mask: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, mask.shape, generator=g) * mask
    types = torch.randint(0, 2, mask.shape, generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_packing_places_real_tokens_and_restores_them():
    packing = Packing.of(MASK)
    assert packing.cu_seqlens.tolist() == [0, 3, 8, 10, 14]
    assert packing.cu_seqlens.dtype == torch.int32
    assert packing.positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3]
    assert packing.rows.tolist() == [0] * 3 + [1] * 5 + [2] * 2 + [3] * 4
    assert packing.first.tolist() == [0, 3, 8, 10]
    x = torch.randn(4, 5, 3)
    packed = packing.pack(x)
    assert packed.shape == (14, 3)
    torch.testing.assert_close(packing.unpack(packed), x * MASK[..., None])
    mean = (x * MASK[..., None]).sum(1) / MASK.sum(1, keepdim=True)
    torch.testing.assert_close(packing.mean(packed), mean)


def test_left_padding_keeps_the_padded_models_positions():
    packing = Packing.of(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
    assert packing.positions.tolist() == [2, 3, 0, 1, 2, 3]
    assert packing.cu_seqlens.tolist() == [0, 2, 6]


@pytest.mark.parametrize(
    "device, dtype, kernel, expected",
    [
        ("cuda", torch.bfloat16, True, "varlen"),
        ("cuda", torch.float16, True, "varlen"),
        ("cuda", torch.float32, True, "reference"),  # the kernel takes half precision only
        ("cuda", torch.bfloat16, False, "reference"),  # torch < 2.10
        ("cpu", torch.bfloat16, True, "reference"),
        ("cpu", torch.float32, True, "reference"),
    ],
)
def test_attention_backend(device, dtype, kernel, expected):
    assert attention_backend(device, dtype, kernel) == expected


def test_reference_attention_stays_within_each_sequence():
    torch.manual_seed(0)
    packing = Packing.of(MASK)
    q, k, v = (torch.randn(14, 2, 8) for _ in range(3))
    out = varlen_attention(q, k, v, packing)
    # a dense attention with a block-diagonal mask: the same
    same = packing.rows[:, None] == packing.rows[None, :]
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=same
    ).transpose(0, 1)
    torch.testing.assert_close(out, dense)


def test_packed_states_are_the_padded_models_real_positions():
    torch.manual_seed(0)
    model = BertModel(micro_config(), add_pooling_layer=False).eval()
    inputs = batch(MASK)
    padded = model(**inputs).last_hidden_state
    hidden, packing = packed_states(model, inputs["input_ids"], MASK, inputs["token_type_ids"])
    torch.testing.assert_close(hidden, padded[MASK.bool()], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooling, similarity", [("cls", "dot"), ("mean", "cosine")])
def test_retriever_step_packed_equals_padded(pooling, similarity):
    """The contrastive loss and every gradient of a retriever step (2 queries, 2 passages each),
    packed against padded, dropout off (eval mode; backward still runs)."""
    torch.manual_seed(0)
    encoder = BertModel(micro_config(), add_pooling_layer=False)
    model = BiEncoder(encoder, pooling=pooling, similarity=similarity).eval()
    queries = batch(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), seed=1)
    passages = batch(MASK, seed=2)
    results = []
    for packed in (False, True):
        model.zero_grad()
        model.packed = packed
        q, p = model(queries, passages)
        loss = contrastive_loss(q, p, group_size=2)
        loss.backward()
        results.append((loss.detach(), grads(model)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    assert_same_grads(results[0][1], results[1][1])


@pytest.mark.parametrize("checkpointing", [False, True])
def test_condenser_step_packed_equals_padded(checkpointing):
    """Both MLM losses (Condenser eq. 9-11), the late [CLS] and every gradient, packed against
    padded; with gradient checkpointing the packed layers are recomputed, to the same gradients."""
    torch.manual_seed(0)
    model = Condenser(BertForMaskedLM(micro_config()).bert, config=CondenserConfig(n_head_layers=2)).eval()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inputs = batch(MASK, seed=3)
    labels = torch.full(MASK.shape, -100)
    labels[MASK.bool() & (torch.arange(5) % 2 == 1)] = 7
    results = []
    for packed in (False, True):
        model.zero_grad()
        model.packed = packed
        out = model(inputs["input_ids"], MASK, labels, inputs["token_type_ids"])
        out.loss.backward()
        results.append((out, grads(model)))
    (padded, g_padded), (packed, g_packed) = results
    for name in ("loss", "head_mlm", "backbone_mlm", "cls"):
        torch.testing.assert_close(getattr(packed, name), getattr(padded, name), rtol=1e-4, atol=1e-5)
    assert_same_grads(g_padded, g_packed)
    encoded = model.encode(inputs["input_ids"], MASK, inputs["token_type_ids"])  # packed, as set
    torch.testing.assert_close(encoded, padded.cls.detach(), rtol=1e-4, atol=1e-5)


def test_attention_packed_switches_the_models_that_have_the_path():
    torch.manual_seed(0)
    model = BiEncoder(BertModel(micro_config(), add_pooling_layer=False))
    set_attention(model, "packed")
    assert model.packed is True
    assert model.query_model.config._attn_implementation == "sdpa"  # its padded calls
    other = BertModel(micro_config(), add_pooling_layer=False)  # no packed path: stays padded
    set_attention(other, "packed")
    assert not hasattr(other, "packed")
    assert set_packed(model, False) == ["BiEncoder"] and model.packed is False


def test_packed_path_refuses_what_it_cannot_run():
    relative = BertModel(micro_config(position_embedding_type="relative_key"), add_pooling_layer=False)
    with pytest.raises(ValueError, match="training.attention: packed .*relative_key.*use sdpa"):
        check_packable(relative, "the retriever's encoder")
    with pytest.raises(ValueError, match="relative_key"):
        set_packed(BiEncoder(relative), True)


def test_a_retriever_stage_trained_packed_logs_the_padded_runs_losses(train_data, tmp_path, caplog):
    """training.attention: packed through train_retriever's command line: without dropout, the
    same loss at every step as the padded run (the reference attention on a CPU)."""
    import logging

    import pandas as pd
    from conftest import save_tiny_bert
    from training_helpers import argv

    from dprflow.stages import train_retriever

    init = save_tiny_bert(tmp_path / "bert", dropout=0.0)
    assert train_retriever.main(argv(train_data, init, "padded")) == 0
    with caplog.at_level(logging.INFO):
        assert train_retriever.main(argv(train_data, init, "packed", attention="packed")) == 0
    assert "attention: packed in BiEncoder" in caplog.text
    padded, packed = (
        pd.read_csv(train_data / name / "train_log.csv")["loss"] for name in ("padded", "packed")
    )
    assert len(padded) == len(packed) == 6
    torch.testing.assert_close(torch.tensor(packed.values), torch.tensor(padded.values), rtol=1e-4, atol=1e-5)


def test_the_batch_carries_its_packing_made_on_the_host():
    """with_packing: a packing beside each [B, L] attention mask (with the MLM targets' packed
    positions when the mapping has labels), kept through pinning and the copy to the device; a
    micro-batch cut from the batch makes its own (Packing.usable)."""
    labels = torch.full(MASK.shape, -100)
    labels[1, 2], labels[3, 0] = 7, 9
    batch = with_packing(
        ({"input_ids": MASK, "attention_mask": MASK}, {"attention_mask": MASK, "labels": labels})
    )
    first, second = batch
    assert first["packing"].cu_seqlens.tolist() == [0, 3, 8, 10, 14] and first["packing"].mlm is None
    assert second["packing"].mlm.tolist() == [5, 10]  # row 1 position 2, row 3 position 0
    moved = to_device(batch, torch.device("cpu"))
    assert moved[1]["packing"].mlm.tolist() == [5, 10]
    half = split_rows(batch[1], 2)[0]  # rows 0-1: the whole batch's packing is not theirs
    assert Packing.usable(half["packing"], half["attention_mask"]).cu_seqlens.tolist() == [0, 3, 8]
    assert Packing.usable(second["packing"], MASK) is second["packing"]
    assert with_packing({"q_attention_mask": MASK}) == {"q_attention_mask": MASK}  # no mask of its own


def test_step_batches_carry_packings_only_when_the_trainer_packs():
    items = list(range(8))
    batches = StepBatches(items, lambda rng, its: {"attention_mask": MASK[: len(its)]}, seed=1, batch_size=4)
    assert "packing" not in batches[0]
    batches.packed = True
    assert batches[0]["packing"].shape == (4, 5)


def test_condenser_with_the_hosts_packing_is_the_same_step():
    torch.manual_seed(0)
    model = Condenser(BertForMaskedLM(micro_config()).bert, config=CondenserConfig(n_head_layers=2)).eval()
    model.packed = True
    inputs = batch(MASK, seed=3)
    labels = torch.full(MASK.shape, -100)
    labels[MASK.bool() & (torch.arange(5) % 2 == 0)] = 11
    plain = model(inputs["input_ids"], MASK, labels)
    given = model(inputs["input_ids"], MASK, labels, packing=Packing.of(MASK, labels != -100))
    for name in ("loss", "head_mlm", "backbone_mlm", "cls"):
        torch.testing.assert_close(getattr(given, name), getattr(plain, name))


@pytest.mark.parametrize("device, pays", [("cpu", True), ("cuda", False)])
def test_length_groups_only_where_they_pay(device, pays):
    assert length_grouping_pays(device) is pays
