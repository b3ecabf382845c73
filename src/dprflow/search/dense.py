"""Dense retrieval: encode texts, store embeddings, search them exactly, compare neighbourhoods.

Four pieces, each usable alone:

* :func:`encode_texts` turns texts into a float32 ``(N, H)`` matrix through any ``embed_fn``
  (a bi-encoder's ``encode_passage`` or ``encode_query``). Texts are tokenized once, grouped by
  length and padded per batch, so a corpus of short passages does not pay for the longest one.
* :func:`write_embeddings` / :func:`read_embeddings` store one corpus shard as Parquet:
  ``passage_id`` (string) beside ``embedding`` (``fixed_size_list<float32>[H]``).
* :class:`FlatIndex` is exact maximum inner product search (faiss ``IndexFlatIP``) that keeps the
  passage ids beside the vectors and searches in bounded query batches;
  :func:`search_to_run` turns its results into a ``run`` table (:mod:`dprflow.data.schemas`).
* :func:`nb_recall` / :func:`nb_recall_table` measure how well a first-stage retriever's top k
  covers a second-stage retriever's top-n neighbourhood (coCondenser, Gao & Callan 2022, §5.2,
  Eq. 17).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dprflow.data.schemas import schema
from dprflow.files import atomic_path
from dprflow.progress import Progress, format_seconds

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Query batch of FlatIndex searches: faiss's own BLAS query block (distance_compute_blas_query_bs),
# so batching costs no speed (1024-query batches were ~1.5x slower on 64k queries), while faiss's
# result buffers stay 4096 x k.
SEARCH_BATCH = 4096

# torch and faiss are imported where they are used, so that a stage needing only nb_recall_table
# or the embeddings files pays for neither (issue 15). Values: names of torch dtypes.
AUTOCAST_DTYPES: dict[str | None, str | None] = {
    None: None,
    "fp16": "float16",
    "bf16": "bfloat16",
}

# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def tokenize_flat(
    texts: Sequence[str], tokenizer, max_length: int, chunk: int = 1 << 11
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Tokenize ``texts`` unpadded, truncated to ``max_length``, ``chunk`` texts at a time, into one
    flat ``int32`` array per field (``input_ids``, ``attention_mask``, ...) and the ``int64``
    offsets of each text's tokens: 4 bytes a token a field. The tokenizer's own output for a whole
    shard (Python lists and the Rust encodings behind them) took about 30 KB a passage."""
    parts: dict[str, list[np.ndarray]] = {}
    lengths = []
    for start in range(0, len(texts), chunk):
        encoded = tokenizer(list(texts[start : start + chunk]), truncation=True, max_length=max_length)
        sizes = np.fromiter(map(len, encoded["input_ids"]), np.int64, len(encoded["input_ids"]))
        lengths.append(sizes)
        for key, value in encoded.items():
            flat = np.fromiter(itertools.chain.from_iterable(value), np.int32, int(sizes.sum()))
            parts.setdefault(key, []).append(flat)
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(np.concatenate(lengths), out=offsets[1:])
    return {key: np.concatenate(value) for key, value in parts.items()}, offsets


def encode_texts(
    texts: Sequence[str],
    tokenizer,
    embed_fn: Callable[..., torch.Tensor],
    max_length: int,
    batch_size: int = 64,
    sort_by_length: bool = True,
    device: str | torch.device = "cpu",
    autocast: str | None = None,
    log_every: int = 100,
) -> np.ndarray:
    """Encode ``texts`` with ``embed_fn`` and return a float32 ``(N, H)`` array in input order.

    The texts are tokenized once, without padding and truncated to ``max_length`` tokens
    (special tokens included). With ``sort_by_length`` they are then ordered by token count,
    longest first (a stable sort, so equal lengths keep input order), cut into batches of
    ``batch_size`` and each batch is padded only to its own longest member with
    ``tokenizer.pad``; row ``i`` of the result is always the embedding of ``texts[i]``. Longest
    first means the first batch is the largest, so an out-of-memory error shows up at once.

    Args:
        texts: the texts (a passage's title and text are joined by the caller).
        tokenizer: a Hugging Face tokenizer; every field it returns (``input_ids``,
            ``attention_mask`` and, for BERT, ``token_type_ids``) is passed on to ``embed_fn``.
        embed_fn: ``embed_fn(**batch) -> Tensor[B, H]``, the model side (pooling included). It
            must already live on ``device`` and must honour ``attention_mask`` for the result to
            be independent of how the batch was padded.
        max_length: truncation length in tokens.
        batch_size: texts per forward pass.
        sort_by_length: group texts of similar length (the fast path); ``False`` keeps input
            order, which only changes speed, not the result (up to float rounding).
        device: where the batches are sent.
        autocast: ``None`` (full precision), ``"fp16"`` or ``"bf16"``: run ``embed_fn`` under
            ``torch.autocast`` for ``device``'s type (meant for CUDA); the result is float32
            either way.
        log_every: log progress every this many batches.

    Returns:
        ``np.ndarray`` of shape ``(N, H)``, float32. For ``N == 0`` the shape is ``(0, 0)``:
        ``H`` is not known without running the model.
    """
    if autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"unknown autocast {autocast!r}; allowed: None, 'fp16', 'bf16'")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    texts = list(texts)
    n = len(texts)
    if n == 0:
        return np.zeros((0, 0), dtype=np.float32)
    import torch

    device = torch.device(device)

    fields, offsets = tokenize_flat(texts, tokenizer, max_length)
    lengths = np.diff(offsets)
    order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(n)

    dtype = getattr(torch, AUTOCAST_DTYPES[autocast]) if autocast is not None else None
    amp = torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else nullcontext()
    out: np.ndarray | None = None
    n_batches = (n + batch_size - 1) // batch_size
    started = time.perf_counter()
    with torch.inference_mode(), amp:
        for b, start in enumerate(range(0, n, batch_size)):
            rows = order[start : start + batch_size]
            batch = tokenizer.pad(
                {
                    key: [value[offsets[i] : offsets[i + 1]].tolist() for i in rows]
                    for key, value in fields.items()
                },
                padding="longest",
                return_tensors="pt",
            )
            batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
            emb = embed_fn(**batch)  # [B, H]
            if emb.ndim != 2 or emb.shape[0] != len(rows):
                raise ValueError(
                    f"embed_fn returned shape {tuple(emb.shape)} for a batch of {len(rows)} texts; "
                    "expected [batch, hidden]"
                )
            if out is None:
                out = np.empty((n, emb.shape[1]), dtype=np.float32)
            out[rows] = emb.float().cpu().numpy()
            if log_every and ((b + 1) % log_every == 0 or b + 1 == n_batches):
                done = min(start + batch_size, n)
                rate = done / max(time.perf_counter() - started, 1e-9)
                log.info(
                    "encoded %d/%d texts (batch %d/%d, %.1f texts/s, ETA %s)",
                    done,
                    n,
                    b + 1,
                    n_batches,
                    rate,
                    format_seconds((n - done) / rate),
                )
    assert out is not None
    return out


# ---------------------------------------------------------------------------------------------
# Embedding files: one Parquet per corpus shard
# ---------------------------------------------------------------------------------------------


PRECISION_KEY = b"dprflow.precision"


def embeddings_schema(dim: int, precision: str | None = None) -> pa.Schema:
    """Schema of an embeddings shard: ``passage_id`` string, ``embedding`` fixed-size list of ``dim``
    float32; the metadata names the table and, when given, the precision the encoder ran in."""
    metadata = {b"dprflow.table": b"embeddings"}
    if precision is not None:
        metadata[PRECISION_KEY] = precision.encode()
    return pa.schema(
        [("passage_id", pa.string()), ("embedding", pa.list_(pa.float32(), dim))], metadata=metadata
    )


def embeddings_precision(paths: Sequence[str | os.PathLike]) -> str | None:
    """The precision the shards were encoded in (``fp32``, ``bf16``, ``fp16``; ``None`` for shards
    written before it was recorded). Shards of one index encoded in different precisions are an error."""
    found = {}
    for path in paths:
        metadata = pq.read_schema(path).metadata or {}
        found[str(path)] = metadata[PRECISION_KEY].decode() if PRECISION_KEY in metadata else None
    kinds = set(found.values())
    if len(kinds) > 1:
        raise ValueError(
            f"embedding shards encoded in different precisions: {found}; re-encode them with one precision"
        )
    return kinds.pop() if kinds else None


def write_embeddings(
    path: str | os.PathLike, ids: Sequence[str], emb: np.ndarray, precision: str | None = None
) -> Path:
    """Write ``ids`` and the float32 ``(N, H)`` matrix ``emb`` atomically to a Parquet shard at
    ``path``; ``precision`` (the encoder's, e.g. ``bf16``) is recorded in the file's metadata."""
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    if emb.ndim != 2:
        raise ValueError(f"{path}: embeddings must be a 2-D (N, H) array, got shape {emb.shape}")
    ids = [str(i) for i in ids]
    if len(ids) != emb.shape[0]:
        raise ValueError(f"{path}: {len(ids)} passage ids for {emb.shape[0]} embedding rows")
    if not np.isfinite(emb).all():
        row = int(np.nonzero(~np.isfinite(emb).all(axis=1))[0][0])
        raise ValueError(f"{path}: embedding row {row} (passage {ids[row]!r}) is not finite")
    dim = emb.shape[1]
    # pa.array over a contiguous float32 buffer is zero-copy; the list array just views it.
    values = pa.array(emb.reshape(-1), type=pa.float32())
    table = pa.Table.from_arrays(
        [pa.array(ids, type=pa.string()), pa.FixedSizeListArray.from_arrays(values, dim)],
        schema=embeddings_schema(dim, precision),
    )
    with atomic_path(path) as tmp:
        # Float vectors do not compress; skip dictionary and codec work for them.
        pq.write_table(table, tmp, compression="none", use_dictionary=["passage_id"])
    return Path(path)


def read_embeddings(path: str | os.PathLike, dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read a shard written by :func:`write_embeddings`.

    Returns ``(ids, emb)``: ``ids`` an object array of ``N`` passage-id strings and ``emb`` a
    C-contiguous float32 ``(N, H)`` array that views Arrow's buffer where it can (one copy at
    most, when the file holds several row groups). ``dim``, when given, must equal ``H``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such embeddings file (written by the encode stage)")
    try:
        actual = pq.read_schema(path)
    except pa.ArrowException as exc:
        raise ValueError(f"{path}: not a readable Parquet file ({exc})") from exc
    for name in ("passage_id", "embedding"):
        if name not in actual.names:
            raise ValueError(f"{path}: embeddings file lacks column {name!r}; has {actual.names}")
    id_type, emb_type = actual.field("passage_id").type, actual.field("embedding").type
    if not (pa.types.is_string(id_type) or pa.types.is_large_string(id_type)):
        raise ValueError(f"{path}: column 'passage_id' has type {id_type}, expected string")
    if not (pa.types.is_fixed_size_list(emb_type) and emb_type.value_type == pa.float32()):
        raise ValueError(
            f"{path}: column 'embedding' has type {emb_type}, expected fixed_size_list<float>[H]"
        )
    h = emb_type.list_size
    if dim is not None and h != dim:
        raise ValueError(
            f"{path}: embeddings have dimension {h}, expected {dim} (encoded with another model?)"
        )

    table = pq.read_table(path, columns=["passage_id", "embedding"])
    for name in ("passage_id", "embedding"):
        if table.column(name).null_count:
            raise ValueError(f"{path}: column {name!r} has {table.column(name).null_count} null value(s)")
    ids = table.column("passage_id").to_numpy(zero_copy_only=False)
    lists = table.column("embedding").combine_chunks()  # no copy for a single row group
    flat = lists.flatten()  # respects the array's offset
    if flat.null_count:
        raise ValueError(f"{path}: column 'embedding' holds {flat.null_count} null float(s)")
    emb = flat.to_numpy(zero_copy_only=True).reshape(len(lists), h)
    return ids.astype(object, copy=False), emb


# ---------------------------------------------------------------------------------------------
# Exact search
# ---------------------------------------------------------------------------------------------


@contextmanager
def _blas_always() -> Iterator[None]:
    """Make faiss score every query batch with its BLAS kernel, whatever the batch size.

    faiss (1.15) scores batches with ``n_queries * dim < distance_compute_blas_threshold``
    (128000: fewer than 334 queries at dim 384) with a per-pair kernel that is both far slower
    on large corpora and rounds differently, so results would depend on the batch size. The
    threshold is a process-wide faiss setting; it is restored on exit.
    """
    import faiss

    saved = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = 0
    try:
        yield
    finally:
        faiss.cvar.distance_compute_blas_threshold = saved


class FlatIndex:
    """Exact inner-product search over float32 passage embeddings, with the passage ids kept beside.

    A thin layer over faiss ``IndexFlatIP`` (no normalisation: the score is the raw dot product
    the bi-encoder was trained with). Searches run in query batches so that faiss's result
    buffers stay ``batch_size x k``.

    Ties: within each query's results, equal scores are ordered by the position at which the
    passages were added to the index (the order of :meth:`add` calls and of rows within them),
    not by passage id. faiss's heap also prefers the earlier position when a tie straddles the
    k-th place, so results are deterministic for a given add order. Every batch is scored by
    the same BLAS kernel (see :func:`_blas_always`), so the batch size changes neither the order
    nor the scores beyond float32 rounding (BLAS may block a product differently per call
    shape); batches of a few hundred queries or more keep the BLAS kernel efficient.

    Example::

        index = FlatIndex(384)
        index.add(passage_emb, passage_ids)
        scores, ids = index.search(query_emb, k=100)   # scores [Q, 100]; ids[q] holds 100 ids
    """

    def __init__(self, dim: int):
        if dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        import faiss

        self.dim = int(dim)
        self.index = faiss.IndexFlatIP(self.dim)
        self._ids: list[np.ndarray] = []
        self._ids_cat: np.ndarray | None = np.empty(0, dtype=object)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def __len__(self) -> int:
        return self.ntotal

    @property
    def ids(self) -> np.ndarray:
        """Passage ids in index order (an object array of strings)."""
        if self._ids_cat is None:
            self._ids_cat = np.concatenate(self._ids) if self._ids else np.empty(0, dtype=object)
            self._ids = [self._ids_cat]
        return self._ids_cat

    def add(self, emb: np.ndarray, ids: Sequence[str]) -> None:
        """Append the ``(N, dim)`` rows of ``emb`` with their passage ``ids`` (faiss keeps a copy)."""
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[1] != self.dim:
            raise ValueError(f"embeddings of shape {emb.shape} do not fit an index of dimension {self.dim}")
        ids = np.asarray(ids, dtype=object)
        if ids.shape != (emb.shape[0],):
            raise ValueError(f"{ids.shape[0] if ids.ndim else 0} ids for {emb.shape[0]} embedding rows")
        self.index.add(emb)
        self._ids.append(ids)
        self._ids_cat = None

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike], dim: int | None = None) -> FlatIndex:
        """Build an index from embedding shards, one shard in memory at a time besides the index."""
        index: FlatIndex | None = None
        for path in paths:
            ids, emb = read_embeddings(path, dim=dim if index is None else index.dim)
            if index is None:
                index = cls(emb.shape[1])
            index.add(emb, ids)
            log.info("indexed %s: %d passages (%d in all)", path, len(ids), index.ntotal)
        if index is None:
            raise ValueError("no embedding files given")
        return index

    def iter_search(
        self, q_emb: np.ndarray, k: int, batch_size: int = SEARCH_BATCH
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Yield ``(start, scores [b, k'], positions [b, k'])`` per query batch, ``k' = min(k, ntotal)``.

        ``positions`` are int64 row numbers into :attr:`ids`; only one batch's results live at a time.
        """
        q_emb = np.ascontiguousarray(q_emb, dtype=np.float32)
        if q_emb.ndim != 2 or q_emb.shape[1] != self.dim:
            raise ValueError(
                f"query embeddings of shape {q_emb.shape} do not fit an index of dimension {self.dim}"
            )
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        kk = min(int(k), self.ntotal)
        progress = Progress(log, "searched", q_emb.shape[0], unit="queries")
        for start in range(0, q_emb.shape[0], batch_size):
            q = q_emb[start : start + batch_size]
            if kk == 0:
                yield start, np.empty((len(q), 0), np.float32), np.empty((len(q), 0), np.int64)
                continue
            with _blas_always():
                scores, pos = self.index.search(q, kk)
            if (pos < 0).any():  # faiss's "no result" marker: a NaN query scores nothing
                row = start + int(np.nonzero((pos < 0).any(axis=1))[0][0])
                raise ValueError(f"query row {row} found fewer than {kk} passages; is its embedding finite?")
            # Explicit tie order: score descending, then index position ascending.
            order = np.lexsort((pos, -scores), axis=-1)
            scores = np.take_along_axis(scores, order, axis=1)
            pos = np.take_along_axis(pos, order, axis=1)
            progress.update(len(q))
            yield start, scores, pos

    def search(
        self, q_emb: np.ndarray, k: int, batch_size: int = SEARCH_BATCH
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Top-``k`` passages for each query row, in query batches of ``batch_size``.

        Returns ``(scores, ids)``: ``scores`` float32 ``[Q, k']`` in descending order and ``ids``
        a list of ``Q`` object arrays of ``k'`` passage ids, with ``k' = min(k, ntotal)`` (a
        ``k`` beyond the corpus is cut, never padded with faiss's ``-1``).
        """
        q_emb = np.asarray(q_emb)
        kk = min(int(k), self.ntotal)
        all_scores = np.empty((q_emb.shape[0] if q_emb.ndim == 2 else 0, kk), dtype=np.float32)
        ids: list[np.ndarray] = []
        id_table = self.ids
        for start, scores, pos in self.iter_search(q_emb, k, batch_size):
            all_scores[start : start + len(scores)] = scores
            ids.extend(id_table[pos])
        return all_scores, ids


def write_faiss_index(
    index: FlatIndex, out_dir: str | os.PathLike, extra_files: dict[str, str] | None = None
) -> Path:
    """Write ``index`` as a folder pyserini's ``FaissSearcher`` loads: ``index`` (the faiss
    ``IndexFlatIP``) and ``docid`` (one passage id per line, in index order), with
    ``extra_files`` (name -> text) beside them.

    The folder is written under a temporary name and renamed when complete. pyserini returns the
    ids of ``docid`` as its hits' ``docid``: here passage ids (``<doc_id>#<position>``).
    """
    import faiss

    out = Path(out_dir)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    faiss.write_index(index.index, str(tmp / "index"))
    ids = [str(i) for i in index.ids]
    bad = next((i for i in ids if "\n" in i), None)
    if bad is not None:
        shutil.rmtree(tmp)
        raise ValueError(f"passage id {bad!r} holds a line break: it cannot go into a docid file")
    (tmp / "docid").write_text("".join(f"{i}\n" for i in ids))
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def iter_search_run(
    index: FlatIndex, query_ids: Sequence[str], q_emb: np.ndarray, k: int, batch_size: int = SEARCH_BATCH
) -> Iterator[pd.DataFrame]:
    """Yield the ``run`` table of :func:`search_to_run` one query batch at a time (for streaming writes)."""
    query_ids = np.asarray(query_ids, dtype=object)
    if query_ids.shape != (len(q_emb),):
        raise ValueError(f"{query_ids.size} query ids for {len(q_emb)} query embeddings")
    id_table = index.ids
    for start, scores, pos in index.iter_search(q_emb, k, batch_size):
        yield _run_frame(query_ids[start : start + len(scores)], scores, pos, id_table)


def _run_frame(
    query_ids: np.ndarray, scores: np.ndarray, pos: np.ndarray, id_table: np.ndarray
) -> pd.DataFrame:
    """The ``run`` rows of ``b`` queries: ``scores`` and ``pos`` are ``[b, k]``, best first."""
    b, kk = scores.shape
    return pd.DataFrame(
        {
            "query_id": np.repeat(query_ids, kk),
            "passage_id": id_table[pos.reshape(-1)],
            "score": scores.reshape(-1),
            "rank": np.tile(np.arange(1, kk + 1, dtype=np.int32), b),
        }
    )


def search_shards(
    paths: Sequence[str | os.PathLike],
    q_embs: Sequence[np.ndarray],
    ks: Sequence[int],
    batch_size: int = SEARCH_BATCH,
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Exact top-``k`` of each query set over embedding shards, one shard's index in memory at a time.

    Each shard is searched on its own and its top ``k`` merged into the running top ``k`` (score
    descending, then position in the concatenated shards ascending: :class:`FlatIndex`'s order), so
    the result is the search of one index of every shard while memory holds one shard plus the
    ``[Q, k]`` scores and positions (MS MARCO: 8.8M passages in ``finetune.encode_shards`` parts).
    Returns ``(ids, [(scores, positions), ...])``, one pair per query set, ``positions`` into ``ids``.
    """
    if len(q_embs) != len(ks):
        raise ValueError(f"{len(q_embs)} query sets for {len(ks)} depths")
    best = [(np.empty((len(q), 0), np.float32), np.empty((len(q), 0), np.int64)) for q in q_embs]
    ids_parts: list[np.ndarray] = []
    offset, dim = 0, None
    for path in paths:
        ids, emb = read_embeddings(path, dim=dim)
        index = FlatIndex(emb.shape[1])
        dim = index.dim
        index.add(emb, ids)
        del emb
        for j, (q, k) in enumerate(zip(q_embs, ks, strict=True)):
            old_s, old_p = best[j]
            kk = min(int(k), offset + len(ids))
            new_s = np.empty((len(q), kk), np.float32)
            new_p = np.empty((len(q), kk), np.int64)
            for start, scores, pos in index.iter_search(q, k, batch_size):
                stop = start + len(scores)
                cat_s = np.concatenate([old_s[start:stop], scores], axis=1)
                cat_p = np.concatenate([old_p[start:stop], pos + offset], axis=1)
                order = np.lexsort((cat_p, -cat_s), axis=-1)[:, :kk]
                new_s[start:stop] = np.take_along_axis(cat_s, order, axis=1)
                new_p[start:stop] = np.take_along_axis(cat_p, order, axis=1)
            best[j] = (new_s, new_p)
        log.info("searched shard %s: %d passages (%d in all)", path, len(ids), offset + len(ids))
        ids_parts.append(ids)
        offset += len(ids)
        del index
    if not ids_parts:
        raise ValueError("no embedding files given")
    return np.concatenate(ids_parts), best


def iter_run_frames(
    query_ids: Sequence[str],
    scores: np.ndarray,
    pos: np.ndarray,
    id_table: np.ndarray,
    batch_size: int = SEARCH_BATCH,
) -> Iterator[pd.DataFrame]:
    """The ``run`` table of a :func:`search_shards` result, ``batch_size`` queries at a time."""
    query_ids = np.asarray(query_ids, dtype=object)
    for start in range(0, len(query_ids), batch_size):
        stop = start + batch_size
        yield _run_frame(query_ids[start:stop], scores[start:stop], pos[start:stop], id_table)


def search_to_run(
    index: FlatIndex, query_ids: Sequence[str], q_emb: np.ndarray, k: int, batch_size: int = SEARCH_BATCH
) -> pd.DataFrame:
    """Search ``q_emb`` (row ``i`` is query ``query_ids[i]``) and return a ``run`` table.

    Columns follow :data:`dprflow.data.schemas.SCHEMAS` ``["run"]``: ``query_id``, ``passage_id``,
    ``score`` (float32), ``rank`` (int32, from 1), ``min(k, ntotal)`` rows per query in query
    order, ties ordered as described in :class:`FlatIndex`.
    """
    frames = list(iter_search_run(index, query_ids, q_emb, k, batch_size))
    if not frames:
        names = schema("run").names
        return pd.DataFrame(
            {
                name: pd.Series(dtype=dt)
                for name, dt in zip(names, [object, object, "float32", "int32"], strict=True)
            }
        )
    return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------------------------------------
# Neighbourhood recall (coCondenser §5.2)
# ---------------------------------------------------------------------------------------------


def _check_run(run: pd.DataFrame, what: str) -> None:
    missing = [c for c in ("query_id", "passage_id", "rank") if c not in run.columns]
    if missing:
        raise ValueError(f"{what} lacks column(s) {missing}; has {list(run.columns)}")


def nb_recall_table(
    run_r1: pd.DataFrame,
    run_r2: pd.DataFrame,
    ns: Iterable[int] = (50, 100),
    ks: Iterable[int] = (10, 20, 50, 100, 200, 500, 1000),
) -> pd.DataFrame:
    """Neighbourhood recall nb-recall^n@k for every ``n`` in ``ns`` and ``k`` in ``ks``.

    coCondenser (Gao & Callan, 2022), §5.2, Eq. 17: "for a query, the coverage over the 2nd
    stage retriever's top n candidates by the 1st stage retrievers top k candidates",

        nb-recall^n@k = |{stage-1 top k} ∩ {stage-2 top n}| / n,

    averaged over queries. ``run_r1`` is the first-stage retriever (the one that mined the hard
    negatives; its top ``k`` is the cover), ``run_r2`` the second-stage retriever (its top ``n``
    is the neighbourhood). "Top" means ``rank <= n`` (resp. ``k``) in the run's ``rank`` column.

    Conventions where the paper is silent: the average runs over the queries of ``run_r2``; a
    query missing from ``run_r1`` scores 0; the denominator is the size of the query's
    neighbourhood, which is ``n`` whenever ``run_r2`` is at least ``n`` deep (the paper's
    setting) and the whole run when it is shallower. Duplicate (query, passage) rows count once.

    Returns a DataFrame with columns ``n``, ``k``, ``value`` (one row per pair, ``ns`` major).

    Example::

        >>> r2 = pd.DataFrame({"query_id": ["q"] * 2, "passage_id": ["a", "b"], "rank": [1, 2]})
        >>> r1 = pd.DataFrame({"query_id": ["q"] * 3, "passage_id": ["b", "c", "a"], "rank": [1, 2, 3]})
        >>> nb_recall_table(r1, r2, ns=[2], ks=[1, 3])["value"].tolist()
        [0.5, 1.0]
    """
    ns, ks = [int(n) for n in ns], [int(k) for k in ks]
    if not ns or not ks or min(ns + ks) < 1:
        raise ValueError(f"ns and ks must be non-empty lists of positive depths, got ns={ns}, ks={ks}")
    _check_run(run_r1, "run_r1 (first-stage retriever)")
    _check_run(run_r2, "run_r2 (second-stage retriever)")
    cols = ["query_id", "passage_id", "rank"]
    hood = run_r2.loc[run_r2["rank"] <= max(ns), cols]
    hood = hood.sort_values("rank", kind="stable").drop_duplicates(["query_id", "passage_id"])
    if hood.empty:
        raise ValueError(
            "run_r2 (second-stage retriever) has no rows with rank <= n: no neighbourhood to cover"
        )
    cover = run_r1.loc[run_r1["rank"] <= max(ks), cols]
    cover = cover.sort_values("rank", kind="stable").drop_duplicates(["query_id", "passage_id"])
    merged = hood.merge(cover, how="left", on=["query_id", "passage_id"], suffixes=("_2", "_1"))
    rank2 = merged["rank_2"].to_numpy()
    rank1 = merged["rank_1"].to_numpy(dtype=np.float64, na_value=np.inf)
    qid = merged["query_id"].to_numpy()
    queries = pd.unique(hood["query_id"])

    rows = []
    for n in ns:
        in_hood = rank2 <= n
        size = pd.Series(in_hood).groupby(qid).sum().reindex(queries)
        for k in ks:
            hits = pd.Series(in_hood & (rank1 <= k)).groupby(qid).sum().reindex(queries)
            rows.append({"n": n, "k": k, "value": float((hits / size).mean())})
    return pd.DataFrame(rows, columns=["n", "k", "value"])


def nb_recall(run_r1: pd.DataFrame, run_r2: pd.DataFrame, n: int, k: int) -> float:
    """nb-recall^n@k of first-stage ``run_r1`` over second-stage ``run_r2``'s top-``n`` neighbourhood.

    The fraction of ``run_r2``'s top ``n`` passages that appear in ``run_r1``'s top ``k``,
    averaged over ``run_r2``'s queries (coCondenser §5.2, Eq. 17); see :func:`nb_recall_table`
    for the conventions.
    """
    return float(nb_recall_table(run_r1, run_r2, ns=[n], ks=[k])["value"].iloc[0])
