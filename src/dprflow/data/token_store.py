"""An on-disk token store: a corpus tokenized once, memory-mapped, read a batch at a time.

Pre-training reads every token of its corpus, and a corpus held as Python lists of ints costs
about 40 bytes a token (coCondenser stage two on MS MARCO documents: 130-195 GB). A store holds
the token ids as one flat array on disk, as nanoGPT's ``train.bin`` and Tevatron's pre-tokenized
shards do, and a method cuts its spans, windows, chunks and pairs from it per batch
(:class:`Ranges`); resident memory is the pages a batch touches plus 8-16 bytes per document or
chunk for the offsets.

A store is a folder:

- ``tokens.bin``: the token ids of every document, concatenated in document order, no special
  tokens; ``uint16`` when the vocabulary has at most 65,536 ids, else ``uint32``;
- ``offsets.bin``: ``int64 [n_documents + 1]``, document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``;
- optionally ``sentences.bin`` (``int64``, the token offset of every sentence start, then the end)
  and ``doc_sentences.bin`` (``int64 [n_documents + 1]``, each document's first sentence index):
  the sentence cuts CoT-MAE segments its spans by;
- optionally ``importance.bin`` (``float32``, one value per token: CDMAE's AMI, eq. 7-8);
- ``meta.json``: the view (what a document is), the tokenizer's name and vocabulary fingerprint,
  the dtype and the counts.

:class:`TokenStoreWriter` appends documents batch by batch (nothing but the current batch in
memory) to a temporary folder beside the target and renames it on success, so a failed job
leaves nothing that looks finished. :func:`reorder` rewrites a store with its documents in
another order, reading the source's slices with ``pread`` (documents are read from a passages
table in file order, and the pre-training methods order them by ``doc_id``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dprflow.files import disk_full_error

FORMAT_VERSION = 1
INDEX_DTYPE = np.int64


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a vocabulary of ``vocab_size``."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the vocabulary (token -> id): a store is only read with the tokenizer that wrote it."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


class TokenStoreError(ValueError):
    """A token store whose files do not agree with each other or with its ``meta.json``."""


class TokenStore(Sequence):
    """A store opened read-only: item ``i`` is document ``i``'s token ids (``int64`` array).

    Opening checks the files against each other and against ``meta.json`` (sizes, offsets), so a
    truncated or mixed-up store is refused with its path instead of read as empty documents;
    :meth:`check` also reads every id once against the vocabulary. Pickles as its path
    (DataLoader workers reopen the memory maps instead of copying them).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"{self.path}: not a token store (no meta.json); run stage pretrain_tokenize"
            )
        self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        if self.meta.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{meta_path}: token store format {self.meta.get('format')!r}, expected {FORMAT_VERSION}; "
                "delete the folder and tokenize again"
            )
        self.tokens = self._map("tokens", np.dtype(self.meta["dtype"]))
        self.offsets = self._map("offsets", INDEX_DTYPE)
        self.sentences = self._map("sentences", INDEX_DTYPE, optional=True)
        self.doc_sentences = self._map("doc_sentences", INDEX_DTYPE, optional=True)
        self.importance = self._map("importance", np.dtype(np.float32), optional=True)
        self._check_files()

    def _damaged(self, what: str) -> TokenStoreError:
        return TokenStoreError(
            f"{self.path}: damaged token store: {what}; delete the folder and run the workflow again "
            "to tokenize it anew"
        )

    def _check_files(self) -> None:
        """The sizes and offsets of the files against ``meta.json`` and each other (reads the
        offsets, 8 bytes a document; never the tokens)."""
        documents, tokens = self.meta.get("documents"), self.meta.get("tokens")
        if not isinstance(documents, int) or not isinstance(tokens, int):
            raise self._damaged("meta.json has no document and token counts")
        sizes = {"offsets": documents + 1, "tokens": tokens}
        if self.importance is not None:
            sizes["importance"] = tokens
        if self.doc_sentences is not None:
            sizes["doc_sentences"] = documents + 1
        for name, count in sizes.items():
            array = getattr(self, name)
            if len(array) != count:
                raise self._damaged(
                    f"{name}.bin holds {len(array)} values of {array.dtype.name}, meta.json says "
                    f"{count} ({documents} documents, {tokens} tokens)"
                )
        offsets = np.asarray(self.offsets)
        if offsets[0] != 0 or offsets[-1] != tokens or (len(offsets) > 1 and np.diff(offsets).min() < 0):
            raise self._damaged(f"offsets.bin is not a rising sequence from 0 to {tokens} tokens")
        if (self.sentences is None) != (self.doc_sentences is None):
            raise self._damaged("sentences.bin and doc_sentences.bin must be there together")
        if self.sentences is not None and len(self.sentences) != int(self.doc_sentences[-1]) + 1:
            raise self._damaged(
                f"sentences.bin holds {len(self.sentences)} values, doc_sentences.bin counts "
                f"{int(self.doc_sentences[-1])} sentences (and their end)"
            )

    def _map(self, name: str, dtype: np.dtype, optional: bool = False) -> np.ndarray | None:
        path = self.path / f"{name}.bin"
        if not path.exists():
            if optional:
                return None
            raise FileNotFoundError(f"{path}: missing from the token store")
        size, dtype = path.stat().st_size, np.dtype(dtype)
        if size % dtype.itemsize:  # np.memmap would refuse it without the path
            raise self._damaged(
                f"{name}.bin holds {size:,} bytes, not a whole number of {dtype.name} values "
                f"({dtype.itemsize} bytes each): it was cut short"
            )
        if size == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r")

    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            raise TypeError("a TokenStore is indexed by document, not sliced")
        i = range(len(self))[i]
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]], dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per document, ``int64 [n_documents]``."""
        return np.diff(self.offsets)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0

    def check(self, view: str, tokenizer=None) -> TokenStore:
        """Raise unless the store holds ``view`` and was written with ``tokenizer``'s vocabulary."""
        if self.meta["view"] != view:
            raise ValueError(
                f"{self.path}: token store of view {self.meta['view']!r}, this stage reads {view!r}"
            )
        if tokenizer is not None and self.meta["tokenizer_fingerprint"] != tokenizer_fingerprint(tokenizer):
            raise ValueError(
                f"{self.path}: written with tokenizer {self.meta['tokenizer']!r}, whose vocabulary differs "
                f"from {getattr(tokenizer, 'name_or_path', tokenizer)!r}; tokenize with the stage's tokenizer"
            )
        vocab = len(tokenizer) if tokenizer is not None else int(self.meta.get("vocab_size", 0))
        largest = self.largest_id()
        if vocab and largest >= vocab:
            raise self._damaged(f"tokens.bin holds id {largest}, beyond the vocabulary of {vocab} ids")
        return self

    def largest_id(self, chunk: int = 1 << 24) -> int:
        """The largest token id in the store (-1 when empty), read by ``pread`` a chunk at a time:
        the tokens' pages never stay in the job's memory (MS MARCO's documents: 1.5B tokens)."""
        if not isinstance(self.tokens, np.memmap):
            return int(self.tokens.max()) if len(self.tokens) else -1
        largest, dtype = -1, self.tokens.dtype
        with open(self.tokens.filename, "rb") as fh:
            for start in range(0, len(self.tokens), chunk):
                data = os.pread(fh.fileno(), chunk * dtype.itemsize, start * dtype.itemsize)
                largest = max(largest, int(np.frombuffer(data, dtype=dtype).max()))
        return largest


class TokenStoreWriter:
    """Appends documents to a new store; :meth:`close` renames it onto ``path``.

    Use as a context manager: an exception removes the temporary folder. Example::

        with TokenStoreWriter(out, tokenizer, view="documents") as writer:
            for ids in batches_of_token_ids:
                writer.add(ids)
        store = writer.store                            # TokenStore(out)
    """

    def __init__(
        self, path: str | os.PathLike, tokenizer, view: str, meta: dict[str, Any] | None = None
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # What a killed or failed writer of the same store left (a Snakemake job writes it alone).
        for stale in self.path.parent.glob(f".{glob.escape(self.path.name)}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent))
        self.dtype = token_dtype(len(tokenizer))
        self.meta = {
            "format": FORMAT_VERSION,
            "view": view,
            "tokenizer": str(getattr(tokenizer, "name_or_path", "")),
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "vocab_size": len(tokenizer),
            "dtype": self.dtype.name,
            **(meta or {}),
        }
        self.files = {name: open(self.tmp / f"{name}.bin", "wb") for name in ("tokens", "offsets")}
        self.n_tokens = 0
        self.n_sentences = 0
        self.n_documents = 0
        self.files["offsets"].write(np.zeros(1, INDEX_DTYPE).tobytes())
        self.store: TokenStore | None = None

    def _file(self, name: str):
        if name not in self.files:
            if self.n_documents:
                raise ValueError(f"{self.path}: every document must have {name} or none")
            self.files[name] = open(self.tmp / f"{name}.bin", "wb")
            if name == "doc_sentences":
                self.files[name].write(np.zeros(1, INDEX_DTYPE).tobytes())
        return self.files[name]

    def add(
        self,
        ids: Sequence[int] | np.ndarray,
        sentences: np.ndarray | None = None,
        importance: np.ndarray | None = None,
    ) -> None:
        """Append one document: its token ids, optionally its sentence starts ``[m + 1]`` (token
        offsets inside the document, the last one its length) and per-token importance."""
        ids = self._stored(np.asarray(ids))
        self.files["tokens"].write(ids.tobytes())
        if sentences is not None:
            starts = np.asarray(sentences[:-1], dtype=INDEX_DTYPE) + self.n_tokens
            self._file("sentences").write(starts.tobytes())
            self.n_sentences += len(starts)
            self._file("doc_sentences").write(np.asarray([self.n_sentences], INDEX_DTYPE).tobytes())
        elif "sentences" in self.files:
            raise ValueError(f"{self.path}: every document must have sentences or none")
        if importance is not None:
            if len(importance) != len(ids):
                raise ValueError(f"{len(importance)} importance values for {len(ids)} tokens")
            self._file("importance").write(np.asarray(importance, dtype=np.float32).tobytes())
        self.n_tokens += len(ids)
        self.n_documents += 1
        self.files["offsets"].write(np.asarray([self.n_tokens], INDEX_DTYPE).tobytes())

    def _stored(self, ids: np.ndarray) -> np.ndarray:
        """``ids`` in the store's dtype, checked to fit it."""
        if len(ids) and (ids.min() < 0 or ids.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token ids outside 0..{np.iinfo(self.dtype).max}")
        return ids.astype(self.dtype, copy=False)

    def extend(self, docs: Sequence[Sequence[int]]) -> None:
        """Append several documents (token ids only, no sentences or importance), one write per file."""
        if "sentences" in self.files or "importance" in self.files:
            raise ValueError(f"{self.path}: documents with sentences or importance are added one by one")
        lengths = np.fromiter((len(d) for d in docs), dtype=INDEX_DTYPE, count=len(docs))
        ids = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.int64, count=int(lengths.sum()))
        self.files["tokens"].write(self._stored(ids).tobytes())
        self.files["offsets"].write((self.n_tokens + np.cumsum(lengths)).tobytes())
        self.n_tokens += len(ids)
        self.n_documents += len(docs)

    def close(self, counts: dict[str, int] | None = None) -> TokenStore:
        """Finish the store: end the sentence array, write ``meta.json``, rename onto ``path``."""
        if "sentences" in self.files:
            self.files["sentences"].write(np.asarray([self.n_tokens], INDEX_DTYPE).tobytes())
        for fh in self.files.values():
            fh.close()
        self.meta.update(documents=self.n_documents, tokens=self.n_tokens, **(counts or {}))
        (self.tmp / "meta.json").write_text(json.dumps(self.meta, indent=2, sort_keys=True) + "\n")
        if self.path.exists():
            shutil.rmtree(self.path)
        os.replace(self.tmp, self.path)
        self.store = TokenStore(self.path)
        return self.store

    def abort(self) -> None:
        """Remove the temporary folder. Closing a file flushes its buffer, which fails again on a
        full disk: that error is dropped, the folder goes all the same."""
        for fh in self.files.values():
            with contextlib.suppress(OSError):
                fh.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> TokenStoreWriter:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None:
            full = disk_full_error(value, self.path)  # measured before the folder goes
            self.abort()
            if full is not None and full is not value:
                raise full from value
        elif self.store is None:
            try:
                self.close()
            except BaseException as exc:
                self.__exit__(type(exc), exc, exc.__traceback__)
                raise


def reorder(source: TokenStore, order: np.ndarray, path: str | os.PathLike, tokenizer) -> TokenStore:
    """A copy of ``source`` at ``path`` whose document ``i`` is ``source[order[i]]`` (sentences
    and importance follow), written document by document. The source's tokens, sentences and
    importance are read with ``pread``, not through its memory maps: the order is random over the
    file, and mapped pages would stay in the job's resident memory until it ends (the whole
    source store: 9 GB for MS MARCO's 3.2M documents); read this way only the offsets are resident."""
    meta = {k: v for k, v in source.meta.items() if k not in ("documents", "tokens")}
    offsets = np.asarray(source.offsets)
    doc_sentences = None if source.doc_sentences is None else np.asarray(source.doc_sentences)
    arrays = {"tokens": source.tokens, "sentences": source.sentences, "importance": source.importance}
    files = {name: open(a.filename, "rb") for name, a in arrays.items() if isinstance(a, np.memmap)}
    try:
        with TokenStoreWriter(path, tokenizer, meta.pop("view"), meta) as writer:
            for i in np.asarray(order, dtype=np.int64):
                start, stop = int(offsets[i]), int(offsets[i + 1])
                ids = _read(files, arrays, "tokens", start, stop)
                sentences = None
                if doc_sentences is not None:
                    first, last = int(doc_sentences[i]), int(doc_sentences[i + 1])
                    sentences = np.append(
                        _read(files, arrays, "sentences", first, last) - start, stop - start
                    )
                importance = None
                if source.importance is not None:
                    importance = _read(files, arrays, "importance", start, stop)
                writer.add(ids, sentences, importance)
            return writer.close()
    finally:
        for fh in files.values():
            fh.close()


def _read(files: dict, arrays: dict[str, np.ndarray], name: str, start: int, stop: int) -> np.ndarray:
    """Items ``start..stop-1`` of the store's array ``name``, by ``pread`` from its file (an
    empty range, or an empty file, reads nothing)."""
    dtype = arrays[name].dtype
    if stop <= start:
        return np.zeros(0, dtype=dtype)
    size = (stop - start) * dtype.itemsize
    data = os.pread(files[name].fileno(), size, start * dtype.itemsize)
    if len(data) != size:
        raise ValueError(f"{files[name].name}: {len(data)} bytes at item {start}, expected {size}")
    return np.frombuffer(data, dtype=dtype)


class Ranges(Sequence):
    """Token ranges ``[starts[i], stops[i])`` of a store's flat token array, read lazily: item
    ``i`` is ``make(store, start, stop)`` (by default the ids as a list of ints, the type the
    batch builders were written for). Holds 16 bytes per range, never the tokens."""

    def __init__(self, store: TokenStore, starts: np.ndarray, stops: np.ndarray, make=None) -> None:
        self.store = store
        self.starts = np.asarray(starts, dtype=INDEX_DTYPE)
        self.stops = np.asarray(stops, dtype=INDEX_DTYPE)
        self.make = make or token_list

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.make(self.store, int(self.starts[i]), int(self.stops[i]))

    def __iter__(self) -> Iterator:
        return (self[i] for i in range(len(self)))


def token_list(store: TokenStore, start: int, stop: int) -> list[int]:
    return store.tokens[start:stop].astype(np.int64).tolist()


def document_ranges(store: TokenStore, min_length: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, stops)`` of the documents with at least ``min_length`` tokens."""
    keep = np.flatnonzero(store.lengths >= min_length)
    return store.offsets[keep], store.offsets[keep + 1]


def chunk_ranges(store: TokenStore, length: int, min_length: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    """Consecutive chunks of at most ``length`` tokens of every document, in order; chunks
    shorter than ``min_length`` (a document's tail) are dropped. Returns starts, stops and the
    number dropped (the ranges of :func:`dprflow.pretraining.documents.chunk_tokens`)."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    offsets = np.asarray(store.offsets, dtype=INDEX_DTYPE)
    lengths = np.diff(offsets)
    per_doc = -(-lengths // length)  # ceil
    doc = np.repeat(np.arange(len(lengths)), per_doc)
    first = np.repeat(np.cumsum(per_doc) - per_doc, per_doc)
    starts = offsets[doc] + (np.arange(len(doc)) - first) * length
    stops = np.minimum(starts + length, offsets[doc + 1])
    keep = stops - starts >= min_length
    return starts[keep], stops[keep], int((~keep).sum())


def window_ranges(n_tokens: int, length: int, min_length: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    """Consecutive windows of ``length`` tokens of the whole token stream, the last shorter and
    dropped when it holds fewer than ``min_length`` tokens (returned as 1 or 0)."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    starts = np.arange(0, n_tokens, length, dtype=INDEX_DTYPE)
    stops = np.minimum(starts + length, n_tokens)
    dropped = int(len(starts) > 0 and stops[-1] - starts[-1] < min_length)
    if dropped:
        starts, stops = starts[:-1], stops[:-1]
    return starts, stops, dropped
