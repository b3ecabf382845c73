"""Every key of a method's config section reaches its stage (issue 53): the rules build each
section's flags from the schema's keys (dprflow.rule_flags.schema_flags), as the ``training``
section's (tests/test_training_settings.py), so a key added to a section in the schema needs no
list in the rules. The keys a rule passes in another form (an input path, a per-method value, a
phase's own section) are named here, beside the rule.

The values set are derived from the schema (each key's first value other than its default).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from config_edits import other_value
from dry_runs import all_methods_plan, commands_by_rule, stage_args

from dprflow.rule_flags import schema_flags, schema_keys

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = ROOT / "config" / "schema.yaml"
# section -> (the rule whose stage takes its keys, the keys that rule passes in another form)
SECTIONS = {
    "model.mlm": ("pretrain_mlm", ()),
    "pretrain.condenser": ("pretrain_generic", ()),
    "pretrain.cocondenser": ("pretrain_corpus", ("init", "corpus", "qac_passage_tokens")),
    "pretrain.mae": ("pretrain_mae_generic", ("p_dec", "use_projection", "corpus_init", "generic", "corpus")),
    "pretrain.mae.generic": ("pretrain_mae_generic", ()),
    "pretrain.mae.corpus": ("pretrain_mae_corpus", ("documents",)),
    "pretrain.contriever": ("pretrain_contriever", ("corpus",)),
    "pretrain.mlm": ("pretrain_mlm_corpus", ()),
    "pretrain.doc2query": ("doc2query", ("model", "input_prefix", "train")),
    "pretrain.doc2query.train": ("train_doc2query", ()),
}


def schema_section(section: str) -> dict:
    node = yaml.safe_load(SCHEMA_PATH.read_text())
    for part in section.split("."):
        node = node["properties"][part]
    return node["properties"]


# Values chosen by hand where one key's other value must agree with another's.
AGREEING = {
    "model.mlm": {"hidden_size": 320, "heads": 5},
    "pretrain.contriever": {"p_delete": 0.1, "p_replace": 0.05, "p_mask": 0.05},  # at most 1 together
}


def value_for(spec: dict):
    """Another valid value than the default; a string keeps its default (a model name or a
    choice of corpus: another would need another model or file here)."""
    kind = spec.get("type")
    if isinstance(kind, list):  # a nullable setting: another value of its other type
        spec = {**spec, "type": next(k for k in kind if k != "null")}
    if spec.get("type") == "string" and "enum" not in spec:
        return spec["default"]
    return other_value(spec)


def flag_values(section: str) -> dict:
    """A value for each key of ``section`` that its stage takes as a flag."""
    skip = SECTIONS[section][1]
    values = {k: value_for(spec) for k, spec in schema_section(section).items() if k not in skip}
    return {**values, **AGREEING.get(section, {})}


def nested(section: str, values: dict) -> dict:
    out: dict = values
    for part in reversed(section.split(".")):
        out = {part: out}
    return out


def merge(a: dict, b: dict) -> dict:
    return {**a, **{k: merge(a[k], v) if isinstance(v, dict) and k in a else v for k, v in b.items()}}


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[str, list[str]]:
    overrides: dict = {}
    for section in SECTIONS:
        overrides = merge(overrides, nested(section, flag_values(section)))
    # the MLM base too (model.init: mlm trains it; all-methods.yaml starts from MiniLM)
    targets = ("all", "results/pretrain/mlm/model")
    plan = all_methods_plan(tmp_path_factory.mktemp("plan"), yaml.safe_dump(overrides), *targets)
    return commands_by_rule(plan)


@pytest.mark.slow
@pytest.mark.parametrize("section", SECTIONS)
def test_every_key_of_a_method_section_reaches_its_stage(planned, section):
    rule = SECTIONS[section][0]
    assert planned.get(rule), rule
    expected = flag_values(section)
    for line in planned[rule]:
        args = stage_args(line)
        assert {k: getattr(args, k) for k in expected} == expected, (rule, line[:300])


def test_a_key_added_to_a_section_reaches_the_flags_with_no_list_to_edit(tmp_path):
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    condenser = schema["properties"]["pretrain"]["properties"]["condenser"]["properties"]
    condenser["new_key"] = {"type": "integer", "default": 3}
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(schema, sort_keys=False))
    config = {"pretrain": {"condenser": {**{k: None for k in condenser}, "new_key": 7, "batch_size": 16}}}
    flags = schema_flags(config, path, "pretrain.condenser")
    assert flags == "--batch-size 16 --new-key 7"
    assert schema_keys(path, "pretrain.condenser")[-1] == "new_key"
    assert (
        schema_flags(config, path, "pretrain.condenser", passed_otherwise=("new_key",)) == "--batch-size 16"
    )
