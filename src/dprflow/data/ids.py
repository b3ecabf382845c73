"""Row numbers of string ids (passage and query ids) without a Python object per id.

:class:`IdIndex` sorts the ids once as fixed-width bytes and finds each id by binary search:
the ids' bytes plus 8 bytes an id (about 130 MB for MS MARCO's 8.8M passage ids), where a hash
table of Python strings costs about 100 bytes an id, and Arrow's ``index_in`` rebuilds its hash
set on every call. :func:`id_set` and :func:`in_set` keep the rows of a table read in pieces whose
id is in a set.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class IdIndex:
    """The row of each id of an Arrow string array, by binary search over the ids as fixed-width
    bytes sorted once: the ids' bytes (padded to the longest) plus 8 bytes an id, never a Python
    object per id (a hash set of 8.8M MS MARCO passage ids takes seconds to build per lookup)."""

    def __init__(self, ids, block: int = 1 << 16) -> None:
        self.width = max(1, int(pc.max(pc.binary_length(ids)).as_py() or 0)) if len(ids) else 1
        keys = self._bytes(ids, block)
        self.order: np.ndarray | None = np.argsort(keys, kind="stable")
        self.sorted = keys[self.order]

    @classmethod
    def of_distinct(cls, pieces: Iterable[pa.Array]) -> IdIndex:
        """An index of the distinct ids of ``pieces`` (Arrow string arrays: a column read batch
        by batch), an id's row being its rank in sorted order. Each piece is deduplicated as
        fixed-width bytes as it comes, then all of them by one sort: about 3 times the ids' bytes
        at the peak, where Arrow's hash-based ``unique`` of 8.8M ids took about 800 MB."""
        keys = [np.unique(np.array(p.cast(pa.binary()).to_pylist(), dtype=bytes)) for p in pieces]
        index = cls.__new__(cls)
        index.sorted = np.unique(np.concatenate(keys)) if keys else np.zeros(0, dtype="S1")
        index.width = max(1, index.sorted.dtype.itemsize)
        index.order = None  # the row is the position in ``sorted``
        return index

    def _bytes(self, ids, block: int = 1 << 16) -> np.ndarray:
        out = np.empty(len(ids), dtype=f"S{self.width}")
        for start in range(0, len(ids), block):
            out[start : start + block] = ids.slice(start, block).cast(pa.binary()).to_pylist()
        return out

    def rows(self, ids) -> np.ndarray:
        """The row of each of ``ids`` (an Arrow string array), -1 for an id not in the index."""
        if not len(self.sorted):
            return np.full(len(ids), -1, dtype=np.int64)
        fits = pc.less_equal(pc.binary_length(ids), self.width).to_numpy(zero_copy_only=False)
        keys = self._bytes(ids)  # ids longer than the longest indexed one are cut, and not found
        at = np.minimum(np.searchsorted(self.sorted, keys), len(self.sorted) - 1)
        return np.where(fits & (self.sorted[at] == keys), at if self.order is None else self.order[at], -1)

    def __len__(self) -> int:
        return len(self.sorted)

    def duplicate(self) -> str | None:
        """An id on more than one row, if any."""
        same = np.flatnonzero(self.sorted[1:] == self.sorted[:-1])
        return self.sorted[same[0]].decode() if len(same) else None

    def column_rows(self, values) -> np.ndarray:
        """:meth:`rows` of a column that repeats its ids (a pool table's query ids, a popular
        passage): each distinct id is looked up once."""
        values = pa.array(values, pa.string())
        if isinstance(values, pa.ChunkedArray):  # a pandas column backed by Arrow
            values = values.combine_chunks()
        encoded = pc.dictionary_encode(values)
        return self.rows(encoded.dictionary)[encoded.indices.to_numpy(zero_copy_only=False)]


def id_set(ids) -> pa.Array:
    """Distinct string ids as an Arrow array, the value set of :func:`in_set`."""
    return pc.unique(_strings(ids))


def in_set(values, ids: pa.Array) -> np.ndarray:
    """Whether each of ``values`` (a pandas column, a list or an Arrow array of strings) is one
    of ``ids`` (:func:`id_set`), as a numpy bool mask. Arrow's ``is_in``: pandas' ``isin`` on an
    Arrow-backed string column converts every id of the set to an Arrow scalar in Python on each
    call, so a table read in k pieces paid k times the set (evaluate at 1M passages: 16 of its
    33 s; 2.5 s a piece for a set of 500k ids, 0.13 s here)."""
    return pc.is_in(_strings(values), value_set=ids).to_numpy(zero_copy_only=False)


def _strings(values):
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values.cast(pa.string())
    if not isinstance(values, list | tuple) and not hasattr(values, "__array__"):
        values = list(values)  # a set, a generator: any other iterable of ids
    array = pa.array(values, pa.string())
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
