"""Configuration checking: JSON-schema validation with defaults and errors that name the key.

The workflow calls :func:`validate_config` when the DAG is built. Unlike a bare jsonschema error,
an unknown key is reported with its full path and the keys allowed there, and a value outside an
enumeration with the values allowed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml


class ConfigError(ValueError):
    """The configuration does not match config/schema.yaml."""


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top level>"


def _fill_defaults(node: Any, schema: dict) -> Any:
    """Recursively insert schema defaults for missing keys (objects) and items (arrays)."""
    if not isinstance(schema, dict):
        return node
    if isinstance(node, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in node and "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            if key in node:
                node[key] = _fill_defaults(node[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in node:
                if key not in schema.get("properties", {}):
                    node[key] = _fill_defaults(node[key], extra)
    return node


def _message(err: jsonschema.ValidationError) -> str:
    where = _path(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties", {}))
        unknown = sorted(k for k in err.instance if k not in allowed)
        if allowed:
            return f"unknown config key(s) {unknown} at {where}; allowed: {', '.join(allowed)}"
    if err.validator == "enum":
        allowed = ", ".join(map(str, err.validator_value))
        return f"config value {where} = {err.instance!r} is not allowed; allowed: {allowed}"
    return f"config value {where}: {err.message}"


def _check_sources(config: dict) -> list[str]:
    problems = []
    needs = {"beir": "path", "ir_datasets": "ir_datasets"}
    for name, spec in config.get("collections", {}).items():
        src = spec.get("source")
        for other_src, key in needs.items():
            if src == other_src and key not in spec:
                problems.append(f"collections.{name}: source {src!r} needs the key {key!r}")
            if src != other_src and key in spec:
                problems.append(f"collections.{name}: key {key!r} only applies to source {other_src!r}")
        if src != "embedded" and spec.get("max_documents") is not None:
            problems.append(f"collections.{name}: key 'max_documents' only applies to source 'embedded'")
    return problems


def validate_config(config: dict, schema_path: str | Path) -> dict:
    """Fill defaults into ``config`` (in place) and check it; raise :class:`ConfigError` listing every problem."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    _fill_defaults(config, schema)
    validator = jsonschema.Draft202012Validator(schema)
    problems = [
        _message(e) for e in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.path)))
    ]
    if not problems:
        problems = _check_sources(config)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    return config


def load_config(path: str | Path, schema_path: str | Path) -> dict:
    """Read and validate a config file (for scripts and tests; the workflow uses Snakemake's configfile)."""
    return validate_config(yaml.safe_load(Path(path).read_text()) or {}, schema_path)
