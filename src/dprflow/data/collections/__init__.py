"""Sources of test collections: each loader returns a :class:`Collection` of three tables.

- ``embedded``: built at run time from the docstrings of the installed Python standard library
  (no network), see :mod:`dprflow.data.collections.embedded`;
- ``beir``: a folder in BEIR layout, see :mod:`dprflow.data.collections.beir`;
- ``ir_datasets``: any ir_datasets id, see :mod:`dprflow.data.collections.irds`.

The tables follow :data:`dprflow.data.schemas.SCHEMAS` (``documents``, ``queries``, ``qrels``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


@dataclass
class Collection:
    documents: pd.DataFrame  # doc_id, title, text
    queries: pd.DataFrame  # query_id, text, split
    qrels: pd.DataFrame  # query_id, doc_id, relevance
    # Counts of what the loader skipped or noticed by design, by reason, for the stage log.
    counts: dict[str, int] = field(default_factory=dict)
