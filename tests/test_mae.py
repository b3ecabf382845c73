"""Bottlenecked MAE (BMAE / CDMAE / CoT-MAE) on a tiny random BERT: what the decoder sees, the
projection, the losses against references, and the save/load round trips."""

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, BertConfig, BertForMaskedLM, BertModel

from dprflow.pretraining.mae.model import DECODER_CONFIG, DECODER_DIR, BottleneckedMAE, MAEConfig
from dprflow.pretraining.masking import mask_tokens, special_tokens_mask

TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64)
PAD, CLS, SEP, MASK = 0, 1, 2, 3


def tiny_mlm_checkpoint(path, seed: int = 0):
    torch.manual_seed(seed)
    BertForMaskedLM(BertConfig(**TINY)).save_pretrained(path)
    return path


def _spans(lengths, g):
    width = max(lengths) + 2
    ids = torch.full((len(lengths), width), PAD)
    attention = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n + 1] = CLS, SEP
        ids[b, 1 : n + 1] = torch.randint(10, 100, (n,), generator=g)
        attention[b, : n + 2] = 1
    return ids, attention


def mae_batch(lengths=(8, 8, 6, 5), context_lengths=None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Encoder input masked at 0.3; decoder input the same spans (BMAE) or other spans (CoT-MAE) at 0.5."""
    g = torch.Generator().manual_seed(seed)
    ids, attention = _spans(lengths, g)
    dec_ids, dec_attention = (ids, attention) if context_lengths is None else _spans(context_lengths, g)
    specials = (PAD, CLS, SEP, MASK)
    enc = mask_tokens(ids, special_tokens_mask(ids, attention, specials), MASK, 100, g, p=0.3)
    dec = mask_tokens(dec_ids, special_tokens_mask(dec_ids, dec_attention, specials), MASK, 100, g, p=0.5)
    return {
        "enc_input_ids": enc.input_ids,
        "enc_attention_mask": attention,
        "enc_labels": enc.labels,
        "dec_input_ids": dec.input_ids,
        "dec_attention_mask": dec_attention,
        "dec_labels": dec.labels,
    }


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_mlm_checkpoint(tmp_path_factory.mktemp("init"))


@pytest.fixture
def model(checkpoint):
    torch.manual_seed(1)
    return BottleneckedMAE.from_pretrained(checkpoint).eval()


def reference_decoder(model, batch, bottleneck):
    """eq. 5-6 written out: [h_b; Embed(x_dec)[1:]] through the layers (additive mask), CE on all labels."""
    embedded = model.backbone.embeddings(input_ids=batch["dec_input_ids"])
    x = torch.cat([bottleneck[:, None], embedded[:, 1:]], dim=1)
    bias = (1.0 - batch["dec_attention_mask"][:, None, None, :].float()) * torch.finfo(torch.float32).min
    for layer in model.decoder:
        x = layer(x, bias)
        x = x[0] if isinstance(x, tuple) else x
    logits = model.lm_head(x)
    return x, F.cross_entropy(logits.view(-1, TINY["vocab_size"]), batch["dec_labels"].view(-1))


# -- the architecture -----------------------------------------------------------------------------
def test_config_defaults_and_checks(model):
    assert model.config == MAEConfig(
        n_decoder_layers=2, p_enc=0.3, p_dec=0.5, use_projection=True, enc_weight=1.0, dec_weight=1.0
    )
    assert len(model.decoder) == 2
    assert model.decoder[0] is not model.backbone.encoder.layer[0]  # fresh layers, not the encoder's
    assert isinstance(model.projection, nn.Linear) and model.projection.weight.shape == (32, 32)
    assert model.lm_head.predictions.decoder.weight is model.backbone.get_input_embeddings().weight  # tied
    assert not any(p.requires_grad for p in model.backbone.pooler.parameters())  # unused: frozen
    with pytest.raises(ValueError, match="p_dec must be in"):
        MAEConfig(p_dec=1.0)
    with pytest.raises(ValueError, match="n_decoder_layers"):
        MAEConfig(n_decoder_layers=0)
    with pytest.raises(ValueError, match="loss weights"):
        MAEConfig(enc_weight=-1.0)
    with pytest.raises(ValueError, match="contradicts"):
        BottleneckedMAE(model.backbone, config=MAEConfig(use_projection=False), projection=nn.Linear(32, 32))


def _perturbed(model, batch, positions):
    """The outputs with the encoder's last-layer outputs at ``positions`` shifted by 1."""

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        hidden[:, positions] += 1.0
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = model.backbone.encoder.layer[-1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(**batch)
    finally:
        handle.remove()


def test_decoder_sees_the_encoder_only_through_the_bottleneck(model):
    batch = mae_batch()
    with torch.no_grad():
        base = model(**batch)
    tokens = _perturbed(model, batch, slice(1, None))  # every non-CLS encoder output
    assert torch.equal(tokens.dec_mlm, base.dec_mlm)
    assert torch.equal(tokens.cls, base.cls)
    assert not torch.equal(tokens.enc_mlm, base.enc_mlm)  # the hook did act (eq. 3 reads them)
    cls = _perturbed(model, batch, 0)  # h_c
    assert not torch.equal(cls.dec_mlm, base.dec_mlm)
    assert torch.equal(cls.enc_mlm, base.enc_mlm)  # [CLS] is never a masked position
    # the decoder input's own [CLS] is replaced by h_b: its id does not matter
    swapped = dict(batch, dec_input_ids=batch["dec_input_ids"].clone())
    swapped["dec_input_ids"][:, 0] = 50
    with torch.no_grad():
        assert torch.equal(model(**swapped).dec_mlm, base.dec_mlm)


@pytest.mark.parametrize("use_projection", [True, False])
def test_decoder_loss_matches_a_hand_built_decoder(checkpoint, use_projection):
    torch.manual_seed(1)
    model = BottleneckedMAE.from_pretrained(checkpoint, MAEConfig(use_projection=use_projection)).eval()
    batch = mae_batch()
    with torch.no_grad():
        out = model(**batch)
        h_c = model.backbone(
            input_ids=batch["enc_input_ids"], attention_mask=batch["enc_attention_mask"]
        ).last_hidden_state[:, 0]
        assert torch.equal(out.cls, h_c)
        if use_projection:
            h_b = h_c @ model.projection.weight.T + model.projection.bias  # eq. 4
            assert not torch.allclose(h_b, h_c)
        else:
            assert isinstance(model.projection, nn.Identity)
            assert not any(k.startswith("projection.") for k in model.state_dict())
            assert torch.equal(model.bottleneck(h_c), h_c)  # h_b = h_c
            h_b = h_c
        assert torch.allclose(model.bottleneck(h_c), h_b, atol=1e-6)
        hidden, loss = reference_decoder(model, batch, h_b)
        assert out.dec_mlm.item() == pytest.approx(loss.item(), rel=1e-5)
        ours = model.decode(model.bottleneck(h_c), batch["dec_input_ids"], batch["dec_attention_mask"])
        assert torch.allclose(ours, hidden, atol=1e-5)
        other, _ = reference_decoder(model, batch, h_c + 1.0)  # the check can tell bottlenecks apart
        assert not torch.allclose(ours, other, atol=1e-3)


def test_losses_match_bert_mlm_and_the_weights(model, checkpoint):
    batch = mae_batch()
    with torch.no_grad():
        out = model(**batch)
        # L_enc (eq. 3) is BERT's own MLM loss: the checkpoint's BertForMaskedLM on the encoder batch
        reference = BertForMaskedLM.from_pretrained(checkpoint).eval()
        bert = reference(
            input_ids=batch["enc_input_ids"],
            attention_mask=batch["enc_attention_mask"],
            labels=batch["enc_labels"],
        )
        assert out.enc_mlm.item() == pytest.approx(bert.loss.item(), rel=1e-5)
        assert out.loss.item() == pytest.approx(out.enc_mlm.item() + out.dec_mlm.item(), rel=1e-6)
        weighted = BottleneckedMAE(
            model.backbone,
            model.lm_head,
            MAEConfig(enc_weight=0.3, dec_weight=2.0),
            model.decoder,
            model.projection,
        )(**batch)
        assert weighted.loss.item() == pytest.approx(
            0.3 * out.enc_mlm.item() + 2.0 * out.dec_mlm.item(), rel=1e-6
        )
    assert set(out.as_dict()) == {"loss", "enc_mlm", "dec_mlm"}


def test_context_decoder_of_another_length_and_gradients(model):
    """CoT-MAE: the decoder reconstructs a different span (another length); all parts learn."""
    batch = mae_batch(lengths=(8, 8, 6, 5), context_lengths=(4, 11, 6, 9), seed=3)
    assert batch["dec_input_ids"].shape[1] != batch["enc_input_ids"].shape[1]
    model.train()
    out = model(**batch)
    out.loss.backward()
    assert model.decoder[0].attention.self.query.weight.grad.abs().sum() > 0
    assert model.projection.weight.grad.abs().sum() > 0
    assert model.backbone.encoder.layer[3].output.dense.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="batches differ"):
        model(**dict(batch, dec_input_ids=batch["dec_input_ids"][:2]))


def test_from_a_plain_encoder_without_mlm_head(tmp_path, caplog):
    torch.manual_seed(0)
    BertModel(BertConfig(**TINY)).save_pretrained(tmp_path / "plain")
    with caplog.at_level(logging.INFO, logger="dprflow.pretraining.backbone"):
        model = BottleneckedMAE.from_pretrained(tmp_path / "plain", MAEConfig(n_decoder_layers=1))
    assert "W starts random" in caplog.text
    assert len(model.decoder) == 1
    assert torch.isfinite(model(**mae_batch()).loss)


# -- save and load ----------------------------------------------------------------------------------
def test_saved_encoder_is_a_plain_bert_with_the_same_cls(model, tmp_path):
    batch = mae_batch()
    model.save_pretrained(tmp_path / "out", extra={"learning_rate": 3e-4, "out": tmp_path})
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert (tmp_path / "out" / DECODER_DIR / "model.safetensors").is_file()
    record = json.loads((tmp_path / "out" / DECODER_DIR / DECODER_CONFIG).read_text())
    assert record["mae"]["use_projection"] is True and record["tied_decoder_weight"] is True
    assert record["extra"] == {"learning_rate": 3e-4, "out": str(tmp_path)}
    plain = AutoModel.from_pretrained(tmp_path / "out").eval()
    assert type(plain).__name__ == "BertModel"
    with torch.no_grad():
        cls = plain(
            input_ids=batch["enc_input_ids"], attention_mask=batch["enc_attention_mask"]
        ).last_hidden_state[:, 0]
        assert torch.equal(cls, model(**batch).cls)
        assert torch.equal(cls, model.encode(batch["enc_input_ids"], batch["enc_attention_mask"]))


@pytest.mark.parametrize("use_projection", [True, False])
def test_round_trip_restores_the_full_state(checkpoint, tmp_path, use_projection):
    torch.manual_seed(1)
    model = BottleneckedMAE.from_pretrained(checkpoint, MAEConfig(use_projection=use_projection)).eval()
    batch = mae_batch()
    with torch.no_grad():  # move decoder, projection and head away from any fresh initialisation
        for module in (model.decoder, model.projection, model.lm_head):
            for p in module.parameters():
                p.add_(0.01 * torch.randn_like(p))
        before = model(**batch)
    model.save_pretrained(tmp_path / "out")
    torch.manual_seed(99)  # a fresh decoder would come out differently
    loaded = BottleneckedMAE.from_pretrained(tmp_path / "out").eval()
    assert loaded.config == model.config
    assert loaded.lm_head.predictions.decoder.weight is loaded.backbone.get_input_embeddings().weight
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    with torch.no_grad():
        after = loaded(**batch)
    for name in ("loss", "enc_mlm", "dec_mlm", "cls"):
        assert torch.equal(getattr(after, name), getattr(before, name)), name
    reweighted = BottleneckedMAE.from_pretrained(
        tmp_path / "out", MAEConfig(use_projection=use_projection, dec_weight=0.5, p_dec=0.45)
    )
    assert reweighted.config.dec_weight == 0.5
    with pytest.raises(ValueError, match="n_decoder_layers=2"):
        BottleneckedMAE.from_pretrained(
            tmp_path / "out", MAEConfig(n_decoder_layers=3, use_projection=use_projection)
        )
    with pytest.raises(ValueError, match="use_projection"):
        BottleneckedMAE.from_pretrained(tmp_path / "out", MAEConfig(use_projection=not use_projection))
