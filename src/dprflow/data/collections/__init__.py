"""Sources of test collections: each loader returns a :class:`Collection` of three tables.

- ``embedded``: built at run time from the docstrings of the installed Python standard library
  (no network), see :mod:`dprflow.data.collections.embedded`;
- ``beir``: a folder in BEIR layout, see :mod:`dprflow.data.collections.beir`;
- ``ir_datasets``: any ir_datasets id, see :mod:`dprflow.data.collections.irds`.

The tables follow :data:`dprflow.data.schemas.SCHEMAS` (``documents``, ``queries``, ``qrels``).
The ``beir`` and ``ir_datasets`` loaders stream their documents through :class:`Documents`:
given a ``write`` (a :class:`~dprflow.data.schemas.TableWriter`'s), it hands them on in batches
and the :class:`Collection` comes back without them (MS MARCO's 3.2M documents are about 20 GB of
text); without one, it gathers them into ``Collection.documents``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

DOCUMENT_COLUMNS = ["doc_id", "title", "text"]


@dataclass
class Collection:
    # doc_id, title, text; None when the loader streamed them to a Documents' ``write``.
    documents: pd.DataFrame | None
    queries: pd.DataFrame  # query_id, text, split
    qrels: pd.DataFrame  # query_id, doc_id, relevance
    # Counts of what the loader skipped or noticed by design, by reason, for the stage log.
    counts: dict[str, int] = field(default_factory=dict)


class Documents:
    """A loader's documents, in read order, passed on ``batch_size`` at a time, or sooner when the
    batch's titles and texts reach ``batch_chars`` characters. Documents of MS MARCO's length
    (about 1,100 words, 7,000 characters) would otherwise fill a batch of 16,384 with 110 MB of
    text held several times over (the strings, the DataFrame, the Arrow table being written).
    Ingest of the benchmark's synthetic 1,100-word documents, peak RSS: 748 MB at 16,000
    documents with the document count alone; at 16,000 / 100,000 documents, 412 / 419 MB with
    2^25 characters and 239 / 249 MB with 2^23, the default (about 1,200 such documents).

    With ``write`` (e.g. ``TableWriter.write``) each full batch goes to it as a ``documents``
    DataFrame, so memory holds one batch plus :attr:`ids`; without it the batches are kept and
    :meth:`table` joins them. :attr:`ids` is the set of ids read so far (the loaders' duplicate
    and qrels checks): a Python ``str`` in a set costs about 100 bytes an MS MARCO id (98
    measured for 2M ids: about 56 for the string, the rest its slot), about 0.9 GB for the 8.8M
    passages and 0.35 GB for the 3.2M documents, against about 20 GB for the documents' text.
    """

    def __init__(
        self,
        write: Callable[[pd.DataFrame], None] | None = None,
        batch_size: int = 16384,
        batch_chars: int = 1 << 23,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if batch_chars < 1:
            raise ValueError(f"batch_chars must be at least 1, got {batch_chars}")
        self.write, self.batch_size, self.batch_chars = write, batch_size, batch_chars
        self._chars = 0  # characters of title and text in the current batch
        self.ids: set[str] = set()
        self.empty = 0  # documents whose title and text are both blank
        self._batch: list[tuple[str, str, str]] = []
        self._kept: list[pd.DataFrame] = []

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, doc_id: str, title: str, text: str) -> None:
        """Append one document; the caller has checked that ``doc_id`` is not in :attr:`ids`."""
        self.ids.add(doc_id)
        if not title.strip() and not text.strip():
            self.empty += 1
        self._batch.append((doc_id, title, text))
        self._chars += len(title) + len(text)
        if len(self._batch) >= self.batch_size or self._chars >= self.batch_chars:
            self.flush()

    def flush(self) -> None:
        """Pass the documents added since the last batch on (a loader calls it at the end)."""
        if not self._batch:
            return
        batch = pd.DataFrame(self._batch, columns=DOCUMENT_COLUMNS)
        self._batch, self._chars = [], 0
        if self.write is None:
            self._kept.append(batch)
        else:
            self.write(batch)

    def table(self) -> pd.DataFrame | None:
        """Every document as one table when nothing was written elsewhere, else None."""
        self.flush()
        if self.write is not None:
            return None
        if not self._kept:
            return pd.DataFrame(columns=DOCUMENT_COLUMNS)
        return pd.concat(self._kept, ignore_index=True) if len(self._kept) > 1 else self._kept[0]
