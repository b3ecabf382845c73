"""The GPU path on a CPU (issue 33): every GPU-only decision as a function of the device's
properties given as values, and one training stage run end to end through the branch a GPU takes
(the Trainer told it runs on an H100 or a V100 while its tensors stay on the CPU: CPU autocast in
bf16 or fp16, the fp16 loss scaler, fused AdamW, the gradient cache's memory budget, the memory
check's GPU limit, a kill and a resume)."""

from __future__ import annotations

import logging
import math

import pandas as pd
import pytest
import torch
from conftest import save_tiny_bert
from gpu_cards import H100, V100
from training_helpers import argv

from dprflow import hardware
from dprflow.hardware import CPU, DeviceInfo, choose_device, native_bf16
from dprflow.precision import resolve_precision
from dprflow.pretraining.condenser.model import Condenser
from dprflow.stages import train_retriever
from dprflow.training import steps, trainer
from dprflow.training.memory import (
    CUDA_RESERVED,
    MB,
    StepMemory,
    check_training_memory,
    gradient_cache_budget,
    memory_limits,
    model_state_bytes,
    row_activation_bytes,
)
from dprflow.training.speed import (
    autocast_context,
    ddp_device_ids,
    pin_memory,
    rng_devices,
    tf32_applies,
    use_fused_adamw,
)


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_gpu_path"), dropout=0.0)


def test_precision_follows_the_devices_bf16_support():
    assert resolve_precision("auto", H100) == "bf16" and resolve_precision("fp16", H100) == "fp16"
    # A V100 emulates bf16 (torch.cuda.is_bf16_supported() says yes): auto takes fp16 there.
    assert resolve_precision("auto", V100) == "fp16"
    assert resolve_precision("auto", CPU) == resolve_precision("bf16", CPU) == "fp32"
    with pytest.raises(ValueError, match=r"Tesla V100-SXM2-16GB \(compute capability 7.0\) has no native"):
        resolve_precision("bf16", V100)
    assert [native_bf16(c) for c in ((7, 0), (7, 5), (8, 0), (8, 6), (9, 0))] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert native_bf16((7, 0), rocm=True)
    # The context follows the tensors' device, the precision the properties.
    precision, context, scaler = autocast_context(torch.device("cpu"), "auto", V100)
    assert precision == "fp16" and isinstance(scaler, torch.amp.GradScaler)
    with context:
        assert torch.get_autocast_dtype("cpu") == torch.float16 and torch.is_autocast_enabled("cpu")
    assert autocast_context(torch.device("cpu"), "auto", H100).scaler is None


def test_each_device_decision_given_the_properties():
    assert use_fused_adamw(H100, True) and not use_fused_adamw(H100, False) and not use_fused_adamw(CPU, True)
    assert pin_memory(H100) and not pin_memory(CPU)
    assert tf32_applies(H100) and not tf32_applies(V100) and not tf32_applies(CPU)
    assert ddp_device_ids(torch.device("cuda", 3)) == [3] and ddp_device_ids(torch.device("cpu")) is None
    assert rng_devices(torch.device("cuda", 2)) == [2] and rng_devices(torch.device("cpu")) == []
    assert choose_device(True, 1) == torch.device("cuda", 1) and choose_device(False, 1).type == "cpu"
    assert memory_limits(H100, 4000, None) == [(H100.total_memory, "the GPU's memory")]
    assert memory_limits(CPU, 4000, 2**34) == [
        (4000 * MB, "the job's memory (resources.mem_mb, --mem-mb)"),
        (2**34, "this machine's memory"),
    ]
    assert memory_limits(CPU, 0, None) == []
    assert "80GB HBM3 (79.2 GiB, compute capability 9.0, native bf16)" in H100.describe()


def test_the_memory_check_on_a_gpu_compares_with_its_memory_and_goes_on(tiny_init, caplog):
    model = Condenser.from_pretrained(str(tiny_init))
    step = StepMemory(((2_000_000, 128),))
    with caplog.at_level(logging.INFO):
        estimate = check_training_memory(
            model, step, 1000, ["pretrain.condenser.batch_size"], "auto", info=V100
        )
    assert estimate > V100.total_memory and "training goes on" in caplog.text
    assert "the GPU's memory: 16151 MB" in caplog.text
    with pytest.raises(ValueError, match="the job's memory"):
        check_training_memory(model, step, 1000, ["pretrain.condenser.batch_size"], "auto", info=CPU)


def test_the_gradient_cache_chunk_is_the_largest_that_fits_the_gpu(tiny_init):
    """chunk_from_memory on a real (tiny) Condenser: the budget is the GPU's memory (90%) less the
    model's weights, gradients and AdamW moments and CUDA's own; the chunk is the largest whose
    activations fit it (bf16 under autocast), at least chunk_size, at most the batch."""
    model = Condenser.from_pretrained(str(tiny_init))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    pooler = sum(p.numel() for p in model.backbone.pooler.parameters())  # frozen: unused
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # position and type ids
    state = model_state_bytes(model)
    assert state == 16 * trained + 4 * pooler + buffers and pooler > 0 and buffers > 0
    budget = gradient_cache_budget(V100, model)
    assert budget == int(0.9 * V100.total_memory) - state - CUDA_RESERVED
    assert gradient_cache_budget(CPU, model) is None
    assert gradient_cache_budget(DeviceInfo("cuda", 0, "small", 2**30), model) == 0
    length, masked = 128, 20
    rows = 10 * budget // row_activation_bytes(model, length, 2, masked)  # ten times what fits
    chunks = {}
    for dtype, bytes_per_value in ((torch.bfloat16, 2), (None, 4)):  # autocast or fp32 activations
        per_row = row_activation_bytes(model, length, bytes_per_value, masked)
        with steps.chunk_budget(budget), torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            chunks[bytes_per_value] = chunk = steps.fitting_chunk(model, 8, length, rows, masked)
        assert chunk * per_row <= budget < (chunk + 1) * per_row
    assert chunks[2] > chunks[4] > 8  # 16-bit activations: more rows
    with steps.chunk_budget(0):
        assert steps.fitting_chunk(model, 8, length, rows, masked) == 8  # never below chunk_size


@pytest.fixture
def tf32_flags():
    """TF32 flags are process-wide (the H100 run sets them): put back after the test."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@pytest.mark.usefixtures("tf32_flags")
@pytest.mark.parametrize("gpu", [H100, V100], ids=["h100-bf16", "v100-fp16"])
def test_a_training_stage_runs_the_gpu_path_on_a_cpu(train_data, tiny_init, gpu, monkeypatch, caplog):
    """train_retriever with the gradient cache, told it runs on ``gpu``: mixed precision (CPU
    autocast), fused AdamW, the gradient-cache budget from the GPU's memory, the memory check's GPU
    branch; killed after step 3 and resumed (the fp16 loss scaler's state with it). On 4330655
    this path crashed in Trainer._prepare on ``max()`` of an empty list (the gradient-cache budget)."""
    monkeypatch.setattr(hardware, "device_info", lambda device=None: gpu)
    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: False
    )  # the tensors on the CPU, even on a GPU machine
    monkeypatch.setattr(steps, "_told_chunks", set())  # the chunk is logged once per process
    command = argv(train_data, tiny_init, "fake_gpu", chunk_size=2, checkpoint_every=2)

    class Killed(BaseException):  # a kill, which no stage catches as an error
        pass

    def kill(pid, signal):
        raise Killed

    monkeypatch.setenv(trainer.KILL_ENV, "3")
    monkeypatch.setattr(trainer.os, "kill", kill)
    with caplog.at_level(logging.INFO), pytest.raises(Killed):
        train_retriever.main(command)
    state = torch.load(train_data / "fake_gpu.ckpt" / "step-2" / "trainer_state.pt", weights_only=True)
    fp16 = not gpu.bf16
    assert (state["scaler"] is not None) == fp16
    assert state["cuda_rng"] is None  # the tensors are on the CPU: no CUDA generator to save
    assert "the GPU's memory" in caplog.text and "this machine's memory" not in caplog.text
    resolved = "fp16" if fp16 else "bf16"
    assert (
        f"{gpu.describe()}: {resolved}, fused AdamW True, TF32 {gpu.bf16}, pinned batches True" in caplog.text
    )
    assert "batches padded to a multiple of 8" in caplog.text
    # 4 queries x 3 passages: the whole side fits the GPU, so the cache runs one chunk of it.
    assert "gradient cache: chunks of 12 (chunk_size 2" in caplog.text
    monkeypatch.delenv(trainer.KILL_ENV)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert train_retriever.main(command) == 0
    assert "resumed from" in caplog.text and "at step 2" in caplog.text
    log = pd.read_csv(train_data / "fake_gpu" / "train_log.csv")
    assert log["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(x) for x in log["loss"]) and log["loss"].iloc[0] > 0.5
