"""Reading the workflow's own YAML (config/schema.yaml) fast and once per process.

PyYAML's pure-Python loader takes about 0.2 s for the schema; libyaml's (``CSafeLoader``, in
PyYAML's wheels) about a tenth of that. The config check, the rules' flag builders and the model
settings each read the schema, and a test process checks hundreds of configs: each file is parsed
once per process while its size and mtime stay the same.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import yaml

SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(path: str | os.PathLike) -> Any:
    """The YAML document at ``path`` (safe types only), a copy the caller may change."""
    path = Path(path).resolve()
    st = path.stat()
    return copy.deepcopy(_parsed(path, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=8)
def _parsed(path: Path, mtime_ns: int, size: int) -> Any:
    return yaml.load(path.read_text(), Loader=SafeLoader)  # noqa: S506 (a safe loader)
