"""The config's ``training`` section is declared once, in config/schema.yaml: its keys are the
fields of :class:`dprflow.stage_args.TrainingSettings` (names and defaults), the rules build their
flags from the schema's keys (dprflow.rule_flags), and every key set in a config reaches every
training stage's parsed arguments, as does the precision of every stage that runs a model.

The values set are derived from the schema (each key's first value other than its default), so a
key added to the schema is tested with no edit here.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from config_edits import other_value
from dry_runs import all_methods_plan, commands_by_rule, stage_args

from dprflow.stage_args import TrainArgs, TrainingSettings

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
TRAINING = SCHEMA["properties"]["training"]["properties"]
# Stages that run a model (precision) beside the training stages (their Args subclass TrainArgs).
MODEL_STAGES = {"doc2query", "encode_corpus", "search_dense", "rerank", "score_candidates"}


OTHER = {key: other_value(spec) for key, spec in TRAINING.items()}


def test_the_training_settings_are_the_schemas_training_section():
    fields = {f.name: f.default for f in dataclasses.fields(TrainingSettings)}
    assert list(fields) == list(TRAINING)
    assert fields == {key: spec["default"] for key, spec in TRAINING.items()}
    assert all(OTHER[key] != spec["default"] for key, spec in TRAINING.items())


def missing_settings(commands: dict[str, list[str]], expected: dict[str, Any]) -> list[tuple[str, str]]:
    """(rule, key) for each training job whose parsed arguments miss a value of ``expected``."""
    missing = []
    for rule, lines in sorted(commands.items()):
        for line in lines:
            args = stage_args(line)
            if isinstance(args, TrainArgs):
                missing += [(rule, k) for k, v in expected.items() if getattr(args, k) != v]
    return missing


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[str, list[str]]:
    overrides = {
        "precision": "fp16",
        "training": OTHER,
        "finetune": {"retriever": {"chunk_size": 3}, "distill": {"chunk_size": 2}},
    }
    # the MLM base too (model.init: mlm trains it; all-methods.yaml starts from MiniLM)
    targets = ("all", "results/pretrain/mlm/model")
    plan = all_methods_plan(tmp_path_factory.mktemp("plan"), yaml.safe_dump(overrides), *targets)
    # the jobs that run a stage module (not those that only copy or link files)
    stages = {
        r: [x for x in lines if " -m dprflow.stages." in x] for r, lines in commands_by_rule(plan).items()
    }
    return {rule: lines for rule, lines in stages.items() if lines}


def training_stage_modules() -> set[str]:
    """The stage modules whose arguments are a training stage's (a subclass of TrainArgs)."""
    names = set()
    for path in (ROOT / "src" / "dprflow" / "stages").glob("[a-z]*.py"):
        args = getattr(importlib.import_module(f"dprflow.stages.{path.stem}"), "Args", None)
        if isinstance(args, type) and issubclass(args, TrainArgs):
            names.add(path.stem)
    return names


def test_every_training_setting_reaches_every_training_stage(planned):
    stages = {rule for rule, lines in planned.items() if isinstance(stage_args(lines[0]), TrainArgs)}
    # all-methods.yaml plans every training stage (with the MLM base as a target)
    planned_modules = {type(stage_args(planned[rule][0])).__module__.rsplit(".", 1)[1] for rule in stages}
    assert planned_modules == training_stage_modules() != set()
    expected = {k: (str(v) if k == "pad_to_multiple_of" else v) for k, v in OTHER.items()}
    assert missing_settings(planned, expected) == []
    for rule in sorted(stages | MODEL_STAGES):
        assert rule in planned, rule
        assert {stage_args(line).precision for line in planned[rule]} == {"fp16"}, rule
    chunks = {
        ("distill" if stage_args(c).teacher else "r1/r2"): stage_args(c).chunk_size
        for c in planned["train_retriever"]
    }
    assert chunks == {"r1/r2": 3, "distill": 2}


@pytest.mark.parametrize("key", ["pad_to_multiple_of", "log_every", "attention"])
def test_a_setting_dropped_from_the_flags_is_caught(planned, key):
    flag = f" --{key.replace('_', '-')} {OTHER[key]}"
    (rule, lines), *_ = [(r, x) for r, x in sorted(planned.items()) if flag in x[0]]
    dropped = {rule: [lines[0].replace(flag, "", 1)]}
    assert missing_settings(dropped, {key: getattr(stage_args(lines[0]), key)}) == [(rule, key)]
