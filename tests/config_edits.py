"""The default config edited one key at a time and checked as the DAG build checks it
(:func:`dprflow.config.validate_config`): what tests/test_config_checks.py and
tests/test_planned_jobs.py use to say which message an edit gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema.yaml"


def default_config() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def edited_config(edit=None, check_paths: bool = False) -> dict:
    """The default config after ``edit(config)``, checked and filled in as the DAG build does it
    (without the checks of the files a setting names unless ``check_paths``): the plan tests' start."""
    from dprflow.config import validate_config

    config = default_config()
    if edit:
        edit(config)
    validate_config(config, SCHEMA, check_paths=check_paths)
    return config


def config_problems(edit) -> str:
    """The ConfigError message of the default config after ``edit(config)`` ('' when valid)."""
    from dprflow.config import ConfigError, validate_config

    config = default_config()
    edit(config)
    try:
        validate_config(config, SCHEMA)
    except ConfigError as exc:
        return str(exc)
    return ""


def set_key(path: str, value):
    """An edit that sets the dotted key ``path`` (``finetune.max_passage_length``) to ``value``."""

    def edit(config):
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


def other_value(spec: dict[str, Any]) -> Any:
    """A valid value of a schema property other than its default."""
    default = spec.get("default")
    for alternative in spec.get("anyOf", []):
        value = other_value({**alternative, "default": default})
        if value != default:
            return value
    if "enum" in spec:
        return next((v for v in spec["enum"] if v != default), default)
    kind = spec.get("type")
    if kind == "boolean":
        return not default
    if kind == "integer":
        return default + 1 if isinstance(default, int) else spec.get("minimum", 0) + 3
    if kind == "number":
        return default / 2 if default else 1.0
    raise AssertionError(f"no other value of {spec}: extend other_value for this schema type")
