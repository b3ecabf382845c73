"""The BERT backbone every bottlenecked pre-training model builds on, and how such models are saved.

Condenser (Condenser §3.4) and the masked auto-encoders (CDMAE §3.1) both keep a BERT encoder, add
fresh Transformer layers shaped like the backbone's (the Condenser head, the MAE decoder), and
share one MLM prediction head ``W`` tied to the word embeddings. This module holds those shared
pieces: building and tying the head, fresh layers, calling a ``BertLayer`` directly, the MLM loss
over masked positions, and saving or restoring the extra modules next to a plain BERT folder::

    config.json, model.safetensors, tokenizer files   the backbone (AutoModel loads it alone)
    <extras_dir>/model.safetensors                    extra layers + MLM head (W tied: not stored)
    <extras_dir>/<config_name>                        the model's config, tying flag, training args
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dprflow.models import st_format
from dprflow.models.init import resolve_model
from dprflow.pretraining.masking import IGNORE_INDEX

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("bert",)
EXTRAS_WEIGHTS = "model.safetensors"


def layer_attention_mask(config: Any, hidden: torch.Tensor, attention_mask: torch.Tensor) -> Any:
    """The attention mask that a ``BertLayer`` expects, built as ``BertModel.forward`` builds it."""
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:  # transformers 4.x: an additive [B, 1, 1, L] mask
        mask = attention_mask[:, None, None, :].to(hidden.dtype)
        return (1.0 - mask) * torch.finfo(hidden.dtype).min
    return create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=attention_mask)


def layer_output(output: Any) -> torch.Tensor:
    """A layer's hidden states: transformers 5 returns the tensor, 4.x a tuple starting with it."""
    return output[0] if isinstance(output, tuple) else output


def check_backbone(backbone: nn.Module, what: str) -> None:
    model_type = getattr(backbone.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{what} supports encoders of model_type {', '.join(SUPPORTED_MODEL_TYPES)}; got {model_type!r}"
        )


def new_layers(backbone: nn.Module, n_layers: int) -> nn.ModuleList:
    """``n_layers`` randomly initialised Transformer layers shaped like the backbone's (Condenser §3.4)."""
    from transformers.models.bert.modeling_bert import BertLayer

    head = nn.ModuleList([BertLayer(backbone.config) for _ in range(n_layers)])
    head.apply(backbone._init_weights)
    return head.to(device=backbone.device, dtype=backbone.dtype)


def new_mlm_head(backbone: nn.Module) -> nn.Module:
    from transformers.models.bert.modeling_bert import BertOnlyMLMHead

    lm_head = BertOnlyMLMHead(backbone.config)
    lm_head.apply(backbone._init_weights)
    return lm_head.to(device=backbone.device, dtype=backbone.dtype)


def tie_mlm_head(lm_head: nn.Module, backbone: nn.Module) -> None:
    """Tie W to the word embeddings when the checkpoint's config asks for it, as BertForMaskedLM does."""
    predictions = lm_head.predictions
    if getattr(backbone.config, "tie_word_embeddings", True):
        predictions.decoder.weight = backbone.get_input_embeddings().weight
    predictions.decoder.bias = predictions.bias


def freeze_pooler(backbone: nn.Module) -> None:
    """The pooler is unused (the representation is a [CLS] hidden state); freeze it for DDP.

    Its weights stay in the saved backbone, so ``AutoModel`` loads the folder without a warning.
    """
    pooler = getattr(backbone, "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.requires_grad_(False)


def mlm_loss(
    lm_head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-entropy of ``W h_i`` against ``x_i``, averaged over the masked positions.

    The papers write a sum over masked tokens; like BERT, Hugging Face's ``BertForMaskedLM`` and
    the reference implementations, this is the mean (0 when nothing is masked). Only the masked
    positions go through ``W`` (``[M, V]`` logits instead of ``[B, L, V]``). ``positions``: the
    masked positions' indices, found on the host with the batch (a packed batch's
    :attr:`~dprflow.models.packed.Packing.mlm`), so the GPU is not waited for to learn ``M``.
    """
    if positions is None:
        selected = labels != IGNORE_INDEX  # [B, L] (or [T])
        count = selected.sum().clamp(min=1)
    else:
        selected, count = positions, max(len(positions), 1)
    logits = lm_head(hidden[selected])  # [M, V]
    total = F.cross_entropy(logits, labels[selected], reduction="sum")
    return total / count


def save_with_extras(
    out_dir: str | Path,
    backbone: nn.Module,
    lm_head: nn.Module,
    parts: Mapping[str, nn.Module],
    extras_dir: str,
    config_name: str,
    record: dict[str, Any],
    tokenizer: Any = None,
    pooling: str = "cls",
) -> None:
    """Write ``backbone`` as a plain BERT folder and ``parts`` plus the MLM head into ``extras_dir/``.

    The folder is also a sentence-transformers model with ``pooling`` and the dot product, and
    has a model card (:func:`dprflow.models.st_format.write_pretrained_encoder_files`).

    Each part's tensors are stored under ``<name>.``, the head's under ``lm_head.`` (without the
    output weight when it is tied to the embeddings, and without the bias, which is the
    decoder's); ``record`` is written as JSON with ``tied_decoder_weight`` added. Writes into
    ``out_dir`` as it is; the caller writes to a temporary folder and renames it.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backbone.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    folder = out / extras_dir
    folder.mkdir(exist_ok=True)
    tied_weight = lm_head.predictions.decoder.weight is backbone.get_input_embeddings().weight
    skip = {"predictions.decoder.bias"} | ({"predictions.decoder.weight"} if tied_weight else set())
    state = {f"{name}.{k}": v for name, part in parts.items() for k, v in part.state_dict().items()}
    state.update({f"lm_head.{k}": v for k, v in lm_head.state_dict().items() if k not in skip})
    save_file(
        {k: v.detach().contiguous() for k, v in state.items()}, folder / EXTRAS_WEIGHTS, {"format": "pt"}
    )
    st_format.write_pretrained_encoder_files(
        out, pooling, backbone.config.hidden_size, record.get("extra") or {}
    )
    record = {**record, "tied_decoder_weight": tied_weight}
    (folder / config_name).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


def load_extras(
    folder: Path, record: dict, parts: Mapping[str, nn.Module], lm_head: nn.Module, device: Any
) -> None:
    """Restore ``parts`` and the MLM head from ``folder/model.safetensors`` (see :func:`save_with_extras`)."""
    from safetensors.torch import load_file

    weights = folder / EXTRAS_WEIGHTS
    state = load_file(weights, device=str(device))
    prefixes = tuple(f"{name}." for name in (*parts, "lm_head"))
    unknown = sorted(k for k in state if not k.startswith(prefixes))
    if unknown:
        raise ValueError(f"{weights}: unexpected tensors {unknown[:5]}")

    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}

    for name, module in parts.items():
        module.load_state_dict(part(f"{name}."))
    load_saved_lm_head(lm_head, part("lm_head."), record, weights)


def read_saved_record(folder: Path, config_name: str, what: str) -> dict:
    """The JSON record a saved pre-training model keeps beside its extra weights."""
    config_file = folder / config_name
    try:
        return json.loads(config_file.read_text())
    except FileNotFoundError as exc:
        raise ValueError(f"{folder} holds no {config_name}; not a saved {what}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc


def load_saved_lm_head(lm_head: nn.Module, state: dict, record: dict, weights: Path) -> None:
    """Restore the MLM head; the output weight (when tied to the embeddings) and bias are not stored."""
    missing, unexpected = lm_head.load_state_dict(state, strict=False)
    tied = {"predictions.decoder.bias"} | (
        {"predictions.decoder.weight"} if record.get("tied_decoder_weight", True) else set()
    )
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"{weights}: MLM head mismatch, missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}"
        )


def load_backbone(source: str | Path, what: str, **model_kwargs: Any) -> nn.Module:
    """``AutoModel.from_pretrained(source)``, checked to be a backbone ``what`` supports."""
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(source, **model_kwargs)
    check_backbone(backbone, what)
    return backbone


def backbone_with_mlm_head(
    name_or_path: str | Path, what: str, **model_kwargs: Any
) -> tuple[nn.Module, nn.Module]:
    """The backbone of a plain checkpoint (a folder, a packaged model name or a hub id) and its
    MLM head (:func:`pretrained_mlm_head`): where a fresh Condenser or MAE starts."""
    source = resolve_model(str(name_or_path))
    backbone = load_backbone(source, what, **model_kwargs)
    return backbone, pretrained_mlm_head(source, backbone, **model_kwargs)


def masked_lm(source: str, **model_kwargs: Any) -> nn.Module:
    """The checkpoint as a BERT masked LM (``AutoModelForMaskedLM``): its MLM prediction head
    (``cls``) where it ships one, else a fresh one from torch's global generator (the decoder is
    tied to the word embeddings either way)."""
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
    return lm


def pretrained_mlm_head(source: str, backbone: nn.Module, **model_kwargs: Any) -> nn.Module:
    """The checkpoint's MLM prediction head (``cls``), or a fresh one when it has none (:func:`masked_lm`)."""
    return masked_lm(source, **model_kwargs).cls.to(device=backbone.device, dtype=backbone.dtype)
