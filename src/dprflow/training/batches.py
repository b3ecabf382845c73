"""The batches of a training run: a pure function of ``(seed, step)``, built in worker processes,
and split into micro-batches for gradient accumulation.

- :class:`StepBatches` is a map-style dataset whose item ``step`` is the local batch of that
  optimizer step: the items of the step (the epoch's order comes from ``seed + epoch``) turned
  into model inputs by the stage's ``make_batch`` with a generator seeded by ``(seed, step)``.
  Nothing depends on what was built before, so a resumed run and a run whose batches come from
  DataLoader worker processes see exactly the batches of an uninterrupted single-process run.
- :func:`step_loader` iterates over the steps ``start..steps-1``, in this process
  (``num_workers=0``, today's path) or in ``num_workers`` processes that build batches ahead of
  the training loop, with pinned host memory when the model is on a GPU.
- :func:`split_rows` cuts one batch into ``k`` micro-batches along the row dimension of every
  tensor it holds (a ``[B, ...]`` query tensor and a ``[B * G, ...]`` passage tensor alike), so a
  micro-batch holds ``B / k`` whole examples with their groups.
- :func:`pad_to_multiple` pads a batch's ``[B, L]`` token tensors to a length that is a multiple
  of ``m`` (``training.pad_to_multiple_of``), after the stage built (and masked) it at its
  longest sequence: the same tokens, masks and MLM targets, more padding, a handful of shapes.
  The model's dropout is drawn over the padded shape, so with dropout on the masks (and the
  random stream after them) differ per multiple: other weights, as another seed gives.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dprflow.models.packed import Packing
from dprflow.pretraining.masking import IGNORE_INDEX


def batch_rng(seed: int, step: int) -> np.random.Generator:
    """The generator of one batch's sampling: independent of what ran before (resume-safe)."""
    return np.random.default_rng([seed, step])


def epoch_order(n_items: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, 1_000_003 + epoch]).permutation(n_items)


class StepBatches(torch.utils.data.Dataset):
    """Item ``step`` (0-based, global) is this process's batch of that step.

    ``make_batch(rng, items)`` (or ``make_batch(rng, items, epoch)`` when it takes a third
    argument) turns the items into model inputs. Every rank draws from the same generator and
    keeps its share of the global batch, so the batches do not depend on the process count.
    """

    def __init__(
        self,
        items: Sequence[Any],
        make_batch: Callable[..., Any],
        seed: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        pad_multiple: int = 0,
        pad_id: int = 0,
    ) -> None:
        # A Sequence (e.g. a token store's lazy ranges) is kept as it is: never copied to a list.
        self.items = items if isinstance(items, Sequence) else list(items)
        self.make_batch = make_batch
        self.pad_multiple, self.pad_id = pad_multiple, pad_id
        self.takes_epoch = len(inspect.signature(make_batch).parameters) >= 3
        self.seed = seed
        self.batch_size = batch_size
        self.local_batch = batch_size // world_size
        self.rank = rank
        self.packed = False  # True: each batch carries its packing (the Trainer's packed steps)

    def epoch_and_index(self, step: int) -> tuple[int, int]:
        """The epoch of global step ``step`` (0-based) and the step's place in it."""
        return divmod(step, len(self.items) // self.batch_size)

    def local_items(self, step: int) -> list[Any]:
        """The items of this process's share of global step ``step`` (0-based)."""
        epoch, index = self.epoch_and_index(step)
        order = epoch_order(len(self.items), self.seed, epoch)
        start = index * self.batch_size + self.rank * self.local_batch
        return [self.items[i] for i in order[start : start + self.local_batch]]

    def __getitem__(self, step: int) -> Any:
        rng = batch_rng(self.seed, step)
        items = self.local_items(step)
        if self.takes_epoch:
            batch = self.make_batch(rng, items, self.epoch_and_index(step)[0])
        else:
            batch = self.make_batch(rng, items)
        batch = pad_to_multiple(batch, self.pad_multiple, self.pad_id)
        return with_packing(batch) if self.packed else batch


# What a padded position of a [B, L] token tensor holds, by the end of its name in a batch
# (``q_input_ids``, ``enc_labels``, ...); input ids take the tokenizer's pad id.
PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "labels": IGNORE_INDEX}


def pad_to_multiple(batch: Any, multiple: int, pad_id: int = 0) -> Any:
    """``batch`` with every ``[B, L]`` token tensor of its mappings (``*input_ids``,
    ``*attention_mask``, ``*token_type_ids``, ``*labels``; nested in tuples, lists and
    ``BatchEncoding`` s) padded at the end to the next multiple of ``multiple`` (0 or 1: as it is).

    The padded positions are masked out (attention 0, no MLM target), so every loss is the
    same up to float rounding (``tests/test_gpu_feed.py``); the masking drew its random numbers
    before, at the batch's own length, so the masked tokens are the same too."""
    if multiple <= 1:
        return batch
    if isinstance(batch, Mapping):
        padded = {key: _pad_value(key, value, multiple, pad_id) for key, value in batch.items()}
        return padded if type(batch) is dict else type(batch)(padded)
    if isinstance(batch, (tuple, list)):
        moved = [pad_to_multiple(v, multiple, pad_id) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def _pad_value(key: str, value: Any, multiple: int, pad_id: int) -> Any:
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        return pad_to_multiple(value, multiple, pad_id)
    fill = (
        pad_id
        if key.endswith("input_ids")
        else next((v for k, v in PAD_VALUES.items() if key.endswith(k)), None)
    )
    if fill is None:
        raise ValueError(
            f"training.pad_to_multiple_of: the batch's {key!r} is not a token tensor it knows how to pad "
            f"(*input_ids, {', '.join('*' + k for k in PAD_VALUES)}); set training.pad_to_multiple_of to 0"
        )
    length = value.size(1)
    extra = -length % multiple
    return torch.nn.functional.pad(value, (0, extra), value=fill) if extra else value


def with_packing(batch: Any) -> Any:
    """``batch`` with a ``packing`` (:class:`~dprflow.models.packed.Packing`, from its
    ``attention_mask`` and ``labels``) beside the tensors of each of its mappings that holds a
    ``[B, L]`` ``attention_mask`` (nested in tuples and lists): made on the host while the batch is
    built (the DataLoader's workers, or between steps while the GPU runs the last one), so the
    packed step never waits for the GPU to learn its sizes."""
    if isinstance(batch, Mapping):
        mask = batch.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            return batch
        labels = batch.get("labels")
        targets = None if labels is None else labels != IGNORE_INDEX
        packed = {**batch, "packing": Packing.of(mask, targets)}
        return packed if type(batch) is dict else type(batch)(packed)
    if isinstance(batch, (tuple, list)):
        parts = [with_packing(v) for v in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)
    return batch


def _as_is(batch: Any) -> Any:
    """The DataLoader's collate function: a batch is already built (keeps its types)."""
    return batch


def step_loader(
    batches: StepBatches, start: int, steps: int, num_workers: int = 0, pin_memory: bool = False
) -> Iterator[Any]:
    """The batches of steps ``start..steps-1`` in order.

    ``num_workers=0`` builds each batch in this process when it is needed. Otherwise a
    ``torch.utils.data.DataLoader`` builds them in ``num_workers`` worker processes, a few steps
    ahead (each batch is still ``batches[step]``: the same tensors, whichever worker built it).
    ``pin_memory`` puts them in page-locked memory for faster, asynchronous copies to a GPU.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if num_workers == 0:
        for step in range(start, steps):
            yield batches[step]
        return
    loader = torch.utils.data.DataLoader(
        batches,
        batch_size=None,  # an item is a whole batch
        sampler=range(start, steps),
        num_workers=num_workers,
        collate_fn=_as_is,
        pin_memory=pin_memory,
        prefetch_factor=2,
        # The workers' seeds come from a generator of their own: drawing them from torch's global
        # one would move the dropout masks of the training process. (Batches draw from their
        # (seed, step) generator only, never from a worker's seed.)
        generator=torch.Generator().manual_seed(batches.seed),
    )
    yield from loader


def split_rows(batch: Any, k: int) -> list[Any]:
    """``batch`` cut into ``k`` micro-batches along dim 0 of every tensor (nested in dicts, tuples,
    lists, ``BatchEncoding``); other values (``None``, numbers, strings, 0-dim tensors) go to every
    micro-batch.

    Every tensor's row count must be a multiple of ``k``: micro-batch ``i`` then holds rows
    ``i * n / k : (i + 1) * n / k`` of each, which keeps grouped layouts together (query ``j``'s
    group ``p[j * G : (j + 1) * G]`` lands with query ``j``; coCondenser's sibling spans ``2j``,
    ``2j + 1`` stay in one micro-batch when the documents divide by ``k``).
    """
    if k < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1, got {k}")
    if k == 1:
        return [batch]
    return [_take(batch, k, i) for i in range(k)]


def _take(value: Any, k: int, i: int) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:  # a value of the whole batch (a count to log): every micro-batch sees it
            return value
        if value.size(0) % k:
            raise ValueError(
                f"cannot split a tensor of shape {tuple(value.shape)} into {k} micro-batches "
                "(gradient_accumulation_steps must divide every batch dimension)"
            )
        n = value.size(0) // k
        return value[i * n : (i + 1) * n]
    if isinstance(value, Mapping):
        taken = {key: _take(v, k, i) for key, v in value.items()}
        return taken if type(value) is dict else type(value)(taken)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*(_take(v, k, i) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_take(v, k, i) for v in value)
    return value


def count_tokens(batch: Any) -> int:
    """The real (unpadded) tokens of a batch: the sum of every attention mask it holds, a key
    ``attention_mask`` or ``<sequence>_attention_mask`` (Contriever's ``q_``/``k_``, the MAEs'
    ``enc_``/``dec_``, a seq2seq ``decoder_``), nested in dicts, tuples, lists; for throughput in
    tokens/s."""
    if isinstance(batch, Mapping):
        total = 0
        for key, value in batch.items():
            if str(key).endswith("attention_mask") and isinstance(value, torch.Tensor):
                total += int(value.sum())
            elif not isinstance(value, torch.Tensor):
                total += count_tokens(value)
        return total
    if isinstance(batch, (tuple, list)):
        return sum(count_tokens(v) for v in batch)
    return 0
