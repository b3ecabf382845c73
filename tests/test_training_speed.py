"""The speed switches of the config's training section (issue 25) leave the math as it is: the
loss and the gradients (or the update) with a switch on equal those with it off, to float
tolerance, on the CPU. The GPU-only effects (TF32, fused kernels on CUDA) are in test_gpu.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from mlm_steps import TINY, assert_close, loss_and_grads, padded_batch, tiny_mlm, trainer_for
from transformers import BatchEncoding, BertConfig, BertModel

from dprflow.stage_args import TrainArgs
from dprflow.training import speed
from dprflow.training.optim import adamw


def test_sdpa_attention_gives_the_eager_loss_and_gradients(tmp_path):
    """Padded rows exercise the attention mask; SDPA is transformers' default for BERT."""
    eager = loss_and_grads(tiny_mlm(), TrainArgs(attention="eager"), tmp_path / "e")
    model = tiny_mlm()
    sdpa = loss_and_grads(model, TrainArgs(attention="sdpa"), tmp_path / "s")
    assert model.config._attn_implementation == "sdpa"
    assert_close(sdpa, eager, 1e-5)


@pytest.mark.slow
def test_compiled_encoder_gives_the_eager_loss_and_gradients(tmp_path, monkeypatch):
    """torch.compile of the Transformer (the aot_eager backend here: the same graph capture and
    autograd as inductor without a C++ compiler; test_gpu.py compiles with inductor)."""
    plain = loss_and_grads(tiny_mlm(), TrainArgs(), tmp_path / "p")
    compile_ = speed.compile_transformers
    monkeypatch.setattr(
        "dprflow.training.trainer.compile_transformers", lambda m: compile_(m, backend="aot_eager")
    )
    model = tiny_mlm()
    compiled = loss_and_grads(model, TrainArgs(compile=True), tmp_path / "c")
    # every layer compiled in place: the weights keep their names
    assert all(layer._compiled_call_impl is not None for layer in model.bert.encoder.layer)
    assert set(model.state_dict()) == set(tiny_mlm().state_dict())
    assert_close(compiled, plain, 1e-5)


@pytest.mark.slow
def test_compile_runs_every_layer_of_a_method_in_one_graph_for_every_shape(tmp_path, monkeypatch):
    """The Condenser calls its backbone's and its head's layers itself: all four run compiled
    (compiling the backbone's forward, as before, compiled nothing the Condenser runs), and
    batches of five lengths and two sizes give the graphs of the first batch and no other
    (dynamic shapes: no recompile), with the eager loss and gradients."""
    from torch._dynamo.backends.debugging import aot_eager

    from dprflow.pretraining.condenser.model import Condenser

    graphs = []

    def counting(gm, inputs):
        graphs.append(gm)
        return aot_eager(gm, inputs)

    compile_ = speed.compile_transformers
    monkeypatch.setattr(
        "dprflow.training.trainer.compile_transformers", lambda m: compile_(m, backend=counting)
    )
    batches = [
        padded_batch(i, rows, n) for i, (rows, n) in enumerate([(4, 9), (4, 12), (6, 16), (4, 21), (6, 7)])
    ]
    results, counts = [], []
    for compile in (False, True):
        torch.manual_seed(0)
        model = Condenser(
            BertModel(BertConfig(**TINY, hidden_dropout_prob=0, attention_probs_dropout_prob=0))
        )
        trainer = trainer_for(
            model, TrainArgs(batch_size=1, compile=compile), tmp_path / str(compile), batches
        )
        trainer.model.train()
        losses = []
        for batch in batches:
            losses.append(float(trainer._accumulate(batch)["loss"].detach()))
            counts.append(len(graphs))
        grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
        results.append((losses, grads))
    assert sum(layer._compiled_call_impl is not None for layer in speed.layers_in(model)) == 4
    assert counts[:5] == [0] * 5 and counts[5] > 0 and counts[5:] == [counts[5]] * 5, counts
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_tf32_and_fused_switches_leave_the_cpu_step_as_it_is(tmp_path):
    """On a CPU TF32 and the fused kernel are not used: the step is bit for bit the same."""
    off = loss_and_grads(tiny_mlm(), TrainArgs(tf32=False, fused_adamw=False), tmp_path / "off")
    on = loss_and_grads(tiny_mlm(), TrainArgs(tf32=True, fused_adamw=True), tmp_path / "on")
    assert_close(on, off, 0.0)


def test_fused_adamw_gives_the_same_update():
    """torch's fused AdamW (one kernel over every weight) against its loop: three steps on the
    same gradients (copied from the first model) give the same weights."""
    models = [tiny_mlm(), tiny_mlm()]
    optimizers = [
        adamw(m, TrainArgs(learning_rate=1e-3), fused=f) for m, f in zip(models, (False, True), strict=True)
    ]
    assert optimizers[1].defaults["fused"] and not optimizers[0].defaults["fused"]
    for step in range(3):
        models[0](**padded_batch(step)).loss.backward()
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            b.grad = a.grad.clone()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=name)
    assert not torch.equal(
        models[0].bert.embeddings.word_embeddings.weight, tiny_mlm().bert.embeddings.word_embeddings.weight
    )


def test_reading_the_loss_every_n_steps_logs_the_same_rows(tmp_path):
    """log_every only changes when the values are read back: the same rows, every step."""
    logs = {}
    for every in (1, 3):
        trainer = trainer_for(
            tiny_mlm(), TrainArgs(batch_size=1, log_every=every, warmup_ratio=0.5), tmp_path / str(every)
        )
        logs[every] = pd.DataFrame(trainer.train(lambda m, d: None, tmp_path / str(every) / "log.csv"))
    assert logs[1]["step"].tolist() == logs[3]["step"].tolist() == list(range(1, 9))
    pd.testing.assert_frame_equal(logs[1], logs[3])
    written = pd.read_csv(tmp_path / "3" / "log.csv")
    np.testing.assert_allclose(written["loss"], logs[1]["loss"], rtol=1e-12)


def test_a_non_finite_loss_stops_at_the_next_read_naming_its_step(tmp_path):
    batches = [padded_batch(i) for i in range(8)]
    model = tiny_mlm()

    def step(m, batch):
        loss = m(**batch).loss
        return {"loss": loss * float("nan") if batch is batches[2] else loss}

    trainer = trainer_for(model, TrainArgs(batch_size=1, log_every=4), tmp_path, batches)
    trainer.step_fn = step
    with pytest.raises(FloatingPointError, match="loss is nan at step 3"):
        trainer.train(lambda m, d: None, tmp_path / "log.csv")
    assert not (tmp_path / "log.csv").exists()


def test_batches_move_to_the_device_with_their_structure():
    enc = BatchEncoding({"input_ids": torch.ones(2, 3, dtype=torch.long)})
    batch = {"q": enc, "p": (torch.zeros(2), [torch.ones(1)]), "n": 3, "s": "x"}
    moved = speed.to_device(batch, torch.device("cpu"))
    assert isinstance(moved["q"], BatchEncoding) and torch.equal(moved["q"]["input_ids"], enc["input_ids"])
    assert isinstance(moved["p"], tuple) and isinstance(moved["p"][1], list)
    assert torch.equal(moved["p"][1][0], torch.ones(1)) and moved["n"] == 3 and moved["s"] == "x"
