"""The command-line flags the rules give the stages, built from the config.

Every value is shell-quoted: no config value ever runs as a command. A section's flags are named
after its keys (``batch_size`` -> ``--batch-size``), which are the fields of the stage's argument
dataclass; the ``training`` section's keys are read from ``config/schema.yaml`` itself, so a key
added there reaches every training stage with no list to edit (its field goes in
:class:`dprflow.stage_args.TrainingSettings`; ``tests/test_training_settings.py`` checks both).

Plain functions of the config, not of Snakemake's objects: ruff and the unit tests read them.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dprflow import yamlfile

# Settings that decide how a job runs, not what it writes: resources of the rules, never params,
# and left out of the config the report records, so that changing one reruns no job (how batches
# are built, how often state is saved or the loss read, the BM25 JVM's heap).
RESOURCE_SETTINGS = (
    "finetune.checkpoint_every",
    "training.num_workers",
    "training.log_every",
    "bm25.heap_mb",
)


def q(value: Any) -> str:
    """A value for a shell line, shell-quoted (flag strings are built from quoted values; the
    rules' shell lines quote the rest with {params.x:q})."""
    return shlex.quote(str(value))


def section_flags(section: Mapping[str, Any], keys: Iterable[str]) -> str:
    """``--key value`` flags of ``keys`` of a config section (booleans as true/false; a null
    value is left out, the stage's default then applies)."""
    flags = []
    for key in keys:
        value = section[key]
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        flags.append(f"--{key.replace('_', '-')} {q(value)}")
    return " ".join(flags)


@functools.cache
def schema_keys(schema_path: str | Path, section: str) -> tuple[str, ...]:
    """The keys of a section of the config's schema (``training``, ``pretrain.condenser``), in the
    schema's order (read once per process: every training job's flags ask)."""
    node = yamlfile.load(schema_path)
    for part in section.split("."):
        node = node["properties"][part]
    return tuple(node["properties"])


def schema_flags(
    config: Mapping[str, Any], schema_path: str | Path, section: str, passed_otherwise: Iterable[str] = ()
) -> str:
    """Flags of every key of a config section, in the schema's order, but those the rule passes
    in another form (``passed_otherwise``: a path, a per-method value, a phase's sub-section): a
    key added to the section in the schema reaches its stage with no list to edit."""
    values: Any = config
    for part in section.split("."):
        values = values[part]
    skip = set(passed_otherwise)
    return section_flags(values, [k for k in schema_keys(schema_path, section) if k not in skip])


def precision_flag(config: Mapping[str, Any]) -> str:
    """The numeric precision of every stage that runs a model (training and inference)."""
    return f"--precision {q(config['precision'])}"


def training_flags(config: Mapping[str, Any], schema_path: str | Path) -> str:
    """Flags every training stage takes: the precision and every key of the ``training`` section
    but those of :data:`RESOURCE_SETTINGS` (the rules pass those as resources, so that changing
    one reruns nothing)."""
    keys = [k for k in schema_keys(schema_path, "training") if f"training.{k}" not in RESOURCE_SETTINGS]
    return f"{precision_flag(config)} {section_flags(config['training'], keys)}"


def optim_flags(section: Mapping[str, Any]) -> str:
    """The optimizer flags of a fine-tuning section (retriever, reranker, distillation)."""
    keys = ("batch_size", "group_size", "learning_rate", "weight_decay", "warmup_ratio", "epochs")
    return " " + section_flags(section, [*keys, "max_steps"])


def generic_corpus_flags(pretrain: Mapping[str, Any]) -> str:
    """``--corpus`` and, when the corpus is a file, ``--corpus-path`` of the generic pre-training
    corpus (``pretrain.generic_corpus``), as every stage that reads it takes them."""
    corpus = pretrain["generic_corpus"]
    flags = f"--corpus {q(corpus['source'])}"
    if corpus["path"]:
        flags += f" --corpus-path {q(corpus['path'])}"
    return flags
