"""Checks of the GPU paths: mixed-precision training survives a kill (fp16 with its loss scaler,
bf16), the device's properties as torch reads them, and the memory estimate warns instead of
stopping on a GPU. Skipped where there is no GPU (CI runs on CPU, where tests/test_gpu_path.py
runs the same branches with a GPU's properties given as values); on a GPU machine `make
gpu-check` runs them (docs/clusters.md)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ROOT = Path(__file__).resolve().parents[1]
# train_data (conftest): 12 training queries over 24 passages, a negative pool per query (as the
# CPU tests train on).
WORDS = ["passage", "number", "about", "topic", *map(str, range(30))]


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    """A 2-layer BERT with random weights and a word-level tokenizer of the training texts (no
    packaged model needed, so the test runs on a GPU machine with only torch and transformers)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out = tmp_path_factory.mktemp("tiny_gpu_bert")
    vocab = out / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    # from_pretrained reads vocab.txt; transformers 5 ignores BertTokenizerFast(vocab_file=...).
    tokenizer = BertTokenizerFast.from_pretrained(str(out))
    assert len(tokenizer) == 5 + len(WORDS)
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=5 + len(WORDS),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(out)
    return out


def command(data: Path, init: Path, out: str, precision: str) -> list[str]:
    args = {
        "init": init,
        "queries": data / "queries.parquet",
        "qrels": data / "qrels.parquet",
        "passages": data / "passages.parquet",
        "negatives": data / "negatives.parquet",
        "out": data / out,
        "checkpoint-dir": data / f"{out}.ckpt",
        "batch-size": 4,
        "group-size": 3,
        "epochs": 3,
        "checkpoint-every": 2,
        "learning-rate": 1e-3,
        "precision": precision,
    }
    argv = [sys.executable, "-m", "dprflow.stages.train_retriever"]
    for key, value in args.items():
        argv += [f"--{key}", str(value)]
    return argv


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_training_resumes_after_a_kill(train_data, tiny_init, precision):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    whole = subprocess.run(
        command(train_data, tiny_init, "whole", precision), env=env, capture_output=True, text=True
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    cmd = command(train_data, tiny_init, "resumed", precision)
    killed = subprocess.run(cmd, env={**env, "DPRFLOW_KILL_AFTER_STEP": "3"}, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-3000:]
    state = torch.load(train_data / "resumed.ckpt" / "step-2" / "trainer_state.pt", weights_only=True)
    assert state["cuda_rng"] is not None
    assert (state["scaler"] is not None) == (precision == "fp16")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr and "at step 2" in again.stderr
    a = load_file(train_data / "whole" / "model.safetensors")
    b = load_file(train_data / "resumed" / "model.safetensors")
    assert a.keys() == b.keys()
    # GPU kernels (attention backward) may add in another order from run to run: close, not equal.
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4, msg=key)
    la = pd.read_csv(train_data / "whole" / "train_log.csv")["loss"]
    lb = pd.read_csv(train_data / "resumed" / "train_log.csv")["loss"]
    assert len(la) == len(lb)
    torch.testing.assert_close(torch.tensor(la.values), torch.tensor(lb.values), rtol=1e-3, atol=1e-3)


def test_the_gpus_properties_drive_the_decisions():
    """DeviceInfo read from this GPU: the values tests/test_gpu_path.py gives on a CPU."""
    from dprflow.hardware import device_info
    from dprflow.precision import resolve_precision
    from dprflow.training.speed import pad_multiple, use_fused_adamw

    info = device_info(torch.device("cuda", 0))
    props = torch.cuda.get_device_properties(0)
    assert info.is_cuda and info.name == props.name and info.total_memory == props.total_memory
    assert info.capability == (props.major, props.minor) and info.bf16 == (props.major >= 8)
    assert resolve_precision("auto", info) == ("bf16" if info.bf16 else "fp16")
    assert pad_multiple("auto", info) == 8 and use_fused_adamw(info, True)


def test_a_step_above_the_gpus_memory_warns_and_goes_on(tiny_init, caplog):
    from transformers import AutoModel

    from dprflow.training.memory import check_training_memory

    model = AutoModel.from_pretrained(tiny_init).cuda()
    total = torch.cuda.get_device_properties(0).total_memory
    with caplog.at_level(logging.INFO):
        estimate = check_training_memory(
            model, [(1_000_000, 512)], 0, ["finetune.retriever.batch_size"], "fp16"
        )
    assert estimate > total
    assert "the GPU's memory" in caplog.text and "training goes on" in caplog.text
    assert "finetune.retriever.batch_size" in caplog.text


def test_speed_switches_on_the_gpu_keep_the_loss_and_gradients(tmp_path):
    """The GPU side of tests/test_training_speed.py: TF32 matrix products (fp32 run), the
    inductor-compiled Transformer and the fused AdamW give the plain run's loss and gradients
    (update) to the precision the switch implies."""
    import dataclasses

    from mlm_steps import assert_close, loss_and_grads, padded_batch, tiny_mlm

    from dprflow.stage_args import TrainArgs
    from dprflow.training.optim import adamw

    plain = TrainArgs(precision="fp32", tf32=False, fused_adamw=False)
    reference = loss_and_grads(tiny_mlm(), plain, tmp_path / "plain")
    tf32 = loss_and_grads(tiny_mlm(), dataclasses.replace(plain, tf32=True), tmp_path / "tf32")
    assert_close(tf32, reference, 2e-2)  # 10-bit mantissa products
    torch.backends.cuda.matmul.allow_tf32 = False
    compiled = loss_and_grads(tiny_mlm(), dataclasses.replace(plain, compile=True), tmp_path / "compiled")
    assert_close(compiled, reference, 1e-4)
    models = [tiny_mlm().cuda(), tiny_mlm().cuda()]
    optimizers = [
        adamw(m, TrainArgs(learning_rate=1e-3), fused=f) for m, f in zip(models, (False, True), strict=True)
    ]
    batch = {k: v.cuda() for k, v in padded_batch(0).items()}
    models[0](**batch).loss.backward()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        b.grad = a.grad.clone()
    for optimizer in optimizers:
        optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_the_gradient_cache_chunk_comes_from_the_gpu_memory(tmp_path):
    """chunk_from_memory: the Trainer gives the gradient cache the device's memory less the
    weights and optimizer state; off, the configured chunk_size stays."""
    from mlm_steps import tiny_mlm, trainer_for

    from dprflow.stage_args import TrainArgs

    on = trainer_for(tiny_mlm(), TrainArgs(batch_size=1), tmp_path / "on")
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0 < on.chunk_budget < total
    off = trainer_for(tiny_mlm(), TrainArgs(batch_size=1, chunk_from_memory=False), tmp_path / "off")
    assert off.chunk_budget is None


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))


def test_packed_steps_equal_the_padded_ones_in_bf16(monkeypatch):
    """The padding-free path on the GPU (dprflow.models.packed: torch's varlen_attn): a retriever
    step's contrastive loss and a Condenser step's MLM losses, and every gradient, equal the padded
    step's within bf16 rounding (dropout off; tests/test_packed.py checks the same to 1e-5 on a CPU
    through the reference attention)."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    from dprflow.finetuning.biencoder import BiEncoder
    from dprflow.finetuning.losses import contrastive_loss
    from dprflow.models import packed as packed_module
    from dprflow.pretraining.condenser.model import Condenser, CondenserConfig

    kernel = packed_module.varlen_kernel()
    assert kernel is not None, f"torch {torch.__version__} has no torch.nn.attention.varlen (2.10+)"
    calls = []
    monkeypatch.setattr(
        packed_module, "varlen_kernel", lambda: lambda *a, **k: calls.append(1) or kernel(*a, **k)
    )
    config = BertConfig(
        vocab_size=1000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=128,
    )
    g = torch.Generator().manual_seed(0)

    def inputs(rows: int, length: int) -> dict[str, torch.Tensor]:
        lengths = torch.randint(length // 4, length + 1, (rows,), generator=g)
        mask = (torch.arange(length)[None] < lengths[:, None]).long()
        ids = torch.randint(5, 1000, (rows, length), generator=g) * mask
        return {"input_ids": ids.cuda(), "attention_mask": mask.cuda()}

    def run(model, step) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        results = []
        for packed in (False, True):
            model.zero_grad()
            model.packed = packed
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step(model)
            loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            results.append((loss.detach().float(), grads))
        return results

    def check(results, what: str) -> None:
        (loss_a, grads_a), (loss_b, grads_b) = results
        assert relative_error(loss_b, loss_a) < 1e-2, (what, float(loss_a), float(loss_b))
        assert grads_a.keys() == grads_b.keys() and grads_a
        whole = relative_error(
            torch.cat([grads_b[n].flatten() for n in grads_a]),
            torch.cat([grads_a[n].flatten() for n in grads_a]),
        )
        assert whole < 3e-2, (what, whole)
        # the key bias's gradient is 0 in exact arithmetic (softmax ignores a constant per query):
        # rounding noise in both steps, no relative error to speak of
        worst = max(
            (relative_error(grads_b[n], grads_a[n]), n) for n in grads_a if not n.endswith("key.bias")
        )
        assert worst[0] < 0.1, (what, worst)

    torch.manual_seed(0)
    retriever = BiEncoder(BertModel(config, add_pooling_layer=False)).cuda().eval()
    queries, passages = inputs(16, 32), inputs(64, 128)
    check(run(retriever, lambda m: contrastive_loss(*m(queries, passages), group_size=4)), "retriever")
    condenser = Condenser(BertForMaskedLM(config).bert, config=CondenserConfig()).cuda().eval()
    batch = inputs(32, 128)
    labels = torch.where(
        (torch.rand(batch["input_ids"].shape, generator=g) < 0.15).cuda() & batch["attention_mask"].bool(),
        batch["input_ids"],
        -100,
    )
    check(run(condenser, lambda m: m(batch["input_ids"], batch["attention_mask"], labels).loss), "condenser")
    assert calls, "the packed steps did not reach varlen_attn"


def test_a_retriever_stage_trains_packed_on_the_gpu(train_data, tiny_init):
    """training.attention: packed through the stage's command line on the GPU, in bf16."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = command(train_data, tiny_init, "packed", "bf16") + ["--attention", "packed"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attention: packed in BiEncoder" in done.stderr
    losses = pd.read_csv(train_data / "packed" / "train_log.csv")["loss"]
    assert len(losses) > 0 and losses.notna().all()
