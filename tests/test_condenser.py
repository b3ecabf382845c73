"""Condenser and coCondenser on a tiny random BERT: what the head sees, the losses against references,
and the save/load round trips (plain encoder for fine-tuning, full Condenser for stage two)."""

import json
import logging
import math

import pytest
import torch
from transformers import AutoModel, BertConfig, BertForMaskedLM, BertModel

from dprflow.pretraining.condenser.model import (
    HEAD_CONFIG,
    HEAD_DIR,
    Condenser,
    CondenserConfig,
    cocondenser_contrastive_loss,
    cocondenser_loss,
)
from dprflow.pretraining.masking import mask_tokens, special_tokens_mask

TINY = dict(vocab_size=100, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32)
PAD, CLS, SEP, MASK = 0, 1, 2, 3


def tiny_mlm_checkpoint(path, seed: int = 0):
    torch.manual_seed(seed)
    BertForMaskedLM(BertConfig(**TINY)).save_pretrained(path)
    return path


def masked_batch(lengths=(8, 8, 6, 8, 5, 7), seed: int = 0) -> dict[str, torch.Tensor]:
    """``len(lengths)`` spans of ``[CLS] w.. [SEP]`` with padding, BERT-masked."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths) + 2
    ids = torch.full((len(lengths), width), PAD)
    attention = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n + 1] = CLS, SEP
        ids[b, 1 : n + 1] = torch.randint(10, 100, (n,), generator=g)
        attention[b, : n + 2] = 1
    special = special_tokens_mask(ids, attention, (PAD, CLS, SEP, MASK))
    masked = mask_tokens(ids, special, MASK, 100, g, p=0.3)
    return {"input_ids": masked.input_ids, "attention_mask": attention, "labels": masked.labels}


@pytest.fixture
def model(tmp_path):
    torch.manual_seed(1)
    return Condenser.from_pretrained(tiny_mlm_checkpoint(tmp_path / "init")).eval()


# -- the contrastive loss -------------------------------------------------------------------------
def test_contrastive_loss_by_hand():
    # 3 documents, 2 spans each: rows (0, 1), (2, 3), (4, 5) are siblings
    h = [[1, 0], [1, 1], [0, 1], [0, 2], [1, -1], [2, 0]]
    dot = [[a[0] * b[0] + a[1] * b[1] for b in h] for a in h]
    expected = 0.0
    for i in range(6):
        sibling = i + 1 if i % 2 == 0 else i - 1
        denominator = sum(math.exp(dot[i][k]) for k in range(6) if k != i)  # self excluded
        expected += -math.log(math.exp(dot[i][sibling]) / denominator)
    expected /= 6  # mean over the 2n spans (coCondenser eq. 7)
    # one term written out: span 0 = [1, 0], sibling [1, 1] (dot 1), others 0, 0, 1, 2
    span0 = -math.log(math.e / (math.e + 1 + 1 + math.e + math.e**2))
    assert math.isclose(span0, math.log(2 * math.e + 2 + math.e**2) - 1)
    loss = cocondenser_contrastive_loss(torch.tensor(h, dtype=torch.float64))
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    half = cocondenser_contrastive_loss(torch.tensor(h, dtype=torch.float64), temperature=2.0)
    assert half.item() == pytest.approx(
        cocondenser_contrastive_loss(torch.tensor(h, dtype=torch.float64) / math.sqrt(2)).item(), rel=1e-12
    )


def test_contrastive_loss_needs_pairs():
    with pytest.raises(ValueError, match="two adjacent spans"):
        cocondenser_contrastive_loss(torch.randn(5, 4))


# -- the architecture -----------------------------------------------------------------------------
def test_config_defaults_and_checks(model):
    assert model.config.n_early == 2  # half of the 4 backbone layers
    assert len(model.head) == 2 and model.config.n_head_layers == 2
    assert model.lm_head.predictions.decoder.weight is model.backbone.get_input_embeddings().weight  # W tied
    assert not any(p.requires_grad for p in model.backbone.pooler.parameters())  # unused: frozen
    with pytest.raises(ValueError, match="at least one late layer"):
        Condenser(model.backbone, config=CondenserConfig(n_early=4))
    with pytest.raises(ValueError, match="mlm_probability"):
        CondenserConfig(mlm_probability=1.5)


def _perturbed(model, batch, layer, positions):
    def hook(module, args, output):
        output = output.clone()
        output[:, positions] += 1.0
        return output

    handle = layer.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(**batch)
    finally:
        handle.remove()


def test_head_sees_only_late_cls_and_early_tokens(model):
    batch = masked_batch()
    with torch.no_grad():
        base = model(**batch)
    late_layer, early_layer = model.backbone.encoder.layer[-1], model.backbone.encoder.layer[1]
    late_tokens = _perturbed(model, batch, late_layer, slice(1, None))  # h^late of the tokens
    assert torch.equal(late_tokens.head_mlm, base.head_mlm)  # the head never reads them (eq. 8)
    assert torch.equal(late_tokens.cls, base.cls)
    assert not torch.equal(late_tokens.backbone_mlm, base.backbone_mlm)  # eq. 10 does
    late_cls = _perturbed(model, batch, late_layer, 0)  # h_cls^late
    assert not torch.equal(late_cls.head_mlm, base.head_mlm)
    assert torch.equal(late_cls.backbone_mlm, base.backbone_mlm)  # CLS is never a masked position
    early_tokens = _perturbed(model, batch, early_layer, slice(1, None))  # h^early, layer L^e = 2
    assert not torch.equal(early_tokens.head_mlm, base.head_mlm)


def test_losses_match_a_hand_built_condenser_and_bert_mlm(model, tmp_path):
    batch = masked_batch()
    with torch.no_grad():
        out = model(**batch)
        # backbone MLM (eq. 10) is BERT's own MLM loss: the checkpoint's BertForMaskedLM on the batch
        reference = BertForMaskedLM.from_pretrained(tmp_path / "init").eval()
        assert out.backbone_mlm.item() == pytest.approx(reference(**batch).loss.item(), rel=1e-5)
        # head MLM (eq. 8-9) recomputed by hand from the backbone's hidden states
        states = model.backbone(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True
        ).hidden_states
        x = torch.cat([states[4][:, :1], states[2][:, 1:]], dim=1)
        bias = (1.0 - batch["attention_mask"][:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in model.head:
            x = layer(x, bias)
        logits = model.lm_head(x)
        head = torch.nn.functional.cross_entropy(logits.view(-1, 100), batch["labels"].view(-1))
        assert out.head_mlm.item() == pytest.approx(head.item(), rel=1e-5)
        assert out.loss.item() == pytest.approx(out.head_mlm.item() + out.backbone_mlm.item(), rel=1e-6)
        assert torch.equal(out.cls, states[4][:, 0])
        # coCondenser eq. 7: the MLM losses plus the mean contrastive loss over the spans
        co = cocondenser_loss(model, batch)
        assert co.loss.item() == pytest.approx(
            out.loss.item() + cocondenser_contrastive_loss(out.cls).item(), rel=1e-6
        )
    weighted = Condenser(model.backbone, model.lm_head, CondenserConfig(backbone_weight=0.0), model.head)
    with torch.no_grad():
        assert weighted(**batch).loss.item() == pytest.approx(out.head_mlm.item(), rel=1e-6)


def test_mlm_head_comes_from_the_checkpoint(model, tmp_path):
    reference = BertForMaskedLM.from_pretrained(tmp_path / "init")
    ours, theirs = model.lm_head.state_dict(), reference.cls.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


def test_from_a_plain_encoder_without_mlm_head(tmp_path, caplog):
    torch.manual_seed(0)
    BertModel(BertConfig(**TINY)).save_pretrained(tmp_path / "plain")
    with caplog.at_level(logging.INFO, logger="dprflow.pretraining.backbone"):
        model = Condenser.from_pretrained(tmp_path / "plain", CondenserConfig(n_early=1, n_head_layers=1))
    assert "W starts random" in caplog.text
    assert model.config.n_early == 1 and len(model.head) == 1
    out = model(**masked_batch())
    out.loss.backward()
    assert model.head[0].attention.self.query.weight.grad.abs().sum() > 0
    assert model.backbone.encoder.layer[3].output.dense.weight.grad.abs().sum() > 0  # via eq. 10 and CLS


# -- save and load ----------------------------------------------------------------------------------
def test_saved_backbone_is_a_plain_bert_with_the_same_cls(model, tmp_path):
    batch = masked_batch()
    model.save_pretrained(tmp_path / "out", extra={"learning_rate": 1e-4, "out": tmp_path})
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert (tmp_path / "out" / HEAD_DIR / "model.safetensors").is_file()
    record = json.loads((tmp_path / "out" / HEAD_DIR / HEAD_CONFIG).read_text())
    assert record["condenser"]["n_early"] == 2 and record["tied_decoder_weight"] is True
    assert record["extra"] == {"learning_rate": 1e-4, "out": str(tmp_path)}
    plain = AutoModel.from_pretrained(tmp_path / "out").eval()
    assert type(plain).__name__ == "BertModel"
    with torch.no_grad():
        cls = plain(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[
            :, 0
        ]
        assert torch.equal(cls, model(**batch).cls)
        assert torch.equal(cls, model.encode(batch["input_ids"], batch["attention_mask"]))


def test_condenser_round_trip_restores_the_head(model, tmp_path):
    batch = masked_batch()
    with torch.no_grad():  # train the head a little so that it differs from any fresh initialisation
        for p in model.head.parameters():
            p.add_(0.01 * torch.randn_like(p))
        before = model(**batch)
    model.save_pretrained(tmp_path / "out")
    torch.manual_seed(99)  # a fresh head would come out differently
    loaded = Condenser.from_pretrained(tmp_path / "out").eval()
    assert loaded.config == model.config
    assert loaded.lm_head.predictions.decoder.weight is loaded.backbone.get_input_embeddings().weight
    with torch.no_grad():
        after = loaded(**batch)
    for name in ("loss", "head_mlm", "backbone_mlm", "cls"):
        assert torch.equal(getattr(after, name), getattr(before, name)), name
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # stage two may change the loss weights, not the head's size
    reweighted = Condenser.from_pretrained(tmp_path / "out", CondenserConfig(backbone_weight=0.5))
    assert reweighted.config.n_early == 2 and reweighted.config.backbone_weight == 0.5
    with pytest.raises(ValueError, match="2-layer Condenser head"):
        Condenser.from_pretrained(tmp_path / "out", CondenserConfig(n_head_layers=3))
