"""The derived-figures check catches what changes an experiment: each key below, edited in a copy
of a preset, makes :func:`preset_figures.wrong_figures` report the quantities it
changes (and only keys that change the experiment are listed: a memory setting such as a
non-zero ``chunk_size`` below the batch must keep passing).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from preset_figures import ROOT, planned_jobs, wrong_figures

PRESETS = ROOT / "config" / "presets"

# (preset, dotted key, new value, quantities the check must report as wrong)
MUTATIONS = [
    ("msmarco-cocondenser", "training.gradient_accumulation_steps", 8,
     ["cocondenser stage two / contrastive_spans", "cocondenser retriever 1 / negatives_per_query"]),
    ("msmarco-cocondenser", "pretrain.cocondenser.chunk_size", 0, ["cocondenser stage two / gradient_cache"]),
    ("msmarco-cocondenser", "pretrain.cocondenser.span_min", 120, ["cocondenser stage two / shortest_document"]),
    ("msmarco-cocondenser", "pretrain.cocondenser.spans", "independent", ["cocondenser stage two / pairs"]),
    ("msmarco-cocondenser", "pretrain.cocondenser.init", None,
     ["condenser stage one / runs", "cocondenser stage two / init"]),
    ("msmarco-cocondenser", "pretrain.cocondenser.whole_word", True, ["cocondenser stage two / masking"]),
    ("msmarco-cocondenser", "finetune.distill.batch_size", 64,
     ["cocondenser distillation / queries_per_update", "cocondenser distillation / negatives_per_query"]),
    ("msmarco-cocondenser", "finetune.reranker.depth", 50, ["cocondenser reranker / depth"]),
    ("msmarco-cocondenser", "bm25.negatives_depth", 10, ["cocondenser retriever 1 / bm25_depth"]),
    ("msmarco-cocondenser", "finetune.distill.candidates", 20, ["cocondenser distillation / candidates"]),
    # 256, not the 32: below passages.max_tokens (144) the DAG build refuses it before any
    # figure is derived (tests/test_config_checks.py, passages longer than the encoder reads).
    ("msmarco-cocondenser", "finetune.max_passage_length", 256, ["cocondenser retriever 1 / max_passage_length"]),
    ("msmarco-cdmae", "pretrain.mae.sigma", 5.0, ["cdmae corpus stage / sigma"]),
    ("msmarco-cdmae", "pretrain.pmi.max_n", 2, ["pmi / max_n"]),
    ("msmarco-cdmae", "pretrain.mae.corpus.stop_at_step", 0, ["cdmae corpus stage / optimizer_steps"]),
    ("msmarco-qac", "pretrain.mae.corpus.documents", None, ["cotmae corpus stage / corpus"]),
    ("msmarco-qac", "pretrain.cocondenser.corpus", None, ["qac-cocondenser stage two / queries_of"]),
]  # fmt: skip


def mutated(preset: str, key: str, value, out_dir: Path) -> Path:
    config = copy.deepcopy(yaml.safe_load((PRESETS / f"{preset}.yaml").read_text()))
    *parents, leaf = key.split(".")
    section = config
    for name in parents:
        section = section.setdefault(name, {})
    section[leaf] = value
    path = out_dir / f"{preset}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preset", "key", "value", "expected"), MUTATIONS, ids=[f"{m[0]}:{m[1]}={m[2]}" for m in MUTATIONS]
)
def test_an_edited_preset_fails_the_figures_check(preset, key, value, expected, tmp_path):
    (tmp_path / "work").mkdir()
    wrong = wrong_figures(preset, mutated(preset, key, value, tmp_path), tmp_path / "work")
    reported = {line.split(":", 1)[0] for line in wrong}
    assert set(expected) <= reported, "\n".join(wrong) or "the figures check passed"


def test_a_memory_setting_keeps_passing(tmp_path):
    """A smaller gradient-cache chunk changes memory, not the experiment."""
    (tmp_path / "work").mkdir()
    path = mutated("msmarco-cocondenser", "pretrain.cocondenser.chunk_size", 16, tmp_path)
    assert wrong_figures("msmarco-cocondenser", path, tmp_path / "work") == []


def test_contriever_rows_fine_tune_at_the_pretraining_temperature(tmp_path):
    """Contriever Appendix A: fine-tuning "with a temperature of 0.05, also used during
    pretraining"; the other rows keep the dot product's 1."""
    config = ROOT / "config" / "examples" / "all-methods.yaml"
    jobs = [j for j in planned_jobs(config, tmp_path) if j.rule == "train_retriever"]
    temperature = {(j.wildcards["method"], j.wildcards["trained"]): j.flags.get("temperature") for j in jobs}
    assert {t for (m, _), t in temperature.items() if m == "contriever"} == {"0.05"}
    assert {t for (m, _), t in temperature.items() if m != "contriever"} == {None}
    assert len(temperature) == 3 * 10  # r1, r2, distill of the 10 methods
