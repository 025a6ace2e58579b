"""The DeepSpeed training loop, in-process on one CPU rank (real DeepSpeed engine, gloo group)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.training.batches import token_window_batches
from tasks.training.checkpoint import checkpoint_tags, latest_checkpoint_step
from tasks.training.metrics import ListSink, MlflowSink
from tasks.training.pretrain.stage import lm_loss
from tasks.training.progress import NonFiniteLossError
from tasks.training.sft.stage import sft_batch_tokens
from tests.conftest import (TINY_SEQ as SEQ, loop_model as tiny_model, random_tokens, train_config,
                            train_config_for as cfg_for)
from tests.helpers.training import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def patterned_tokens(n: int = 20_000) -> np.ndarray:
    """Documents of a repeating 0..9 / 10..19 pattern separated by EOS (2): easy to learn."""
    rng = np.random.default_rng(0)
    out = []
    while sum(len(d) for d in out) < n:
        base = 10 + 10 * int(rng.integers(0, 5))
        out.append(np.array([(base + i % 10) for i in range(int(rng.integers(20, 60)))] + [2], dtype=np.uint16))
    return np.concatenate(out)[:n]


def test_loss_decreases_on_patterned_corpus(tmp_path):
    tokens = patterned_tokens()
    cfg = cfg_for(max_steps=40, lr=1e-2, warmup_steps=4, log_every=5, eval_every=20)
    sink = ListSink()
    batches = token_window_batches(tokens, SEQ, cfg.batch.micro_batch_size, seed=0)
    result = train(tiny_model(), cfg, batches, batches, lm_loss, tmp_path / "ckpt", sink)
    steps, losses = sink.series("loss")
    assert steps[-1] == 40 and len(losses) == 8
    assert losses[0] > 3.5  # about ln(64) at the start
    assert losses[-1] < 0.6 * losses[0], losses
    _, val = sink.series("val_loss")
    assert len(val) == 2 and val[-1] < val[0]
    _, ppl = sink.series("val_ppl")
    assert ppl[-1] == pytest.approx(math.exp(val[-1]))
    _, lrs = sink.series("lr")
    assert max(lrs) <= 1e-2 + 1e-12 and lrs[-1] < lrs[1]  # cosine decay
    assert all(k in sink.records[0][1] for k in ("grad_norm", "tokens_per_s", "mfu"))
    assert result.steps == 40 and result.tokens_seen == 40 * 4 * SEQ
    assert result.final_val_ppl == pytest.approx(math.exp(result.final_val_loss))
    assert checkpoint_tags(tmp_path / "ckpt") == ["step00000040"]


def test_tokens_and_mfu_count_what_padded_per_batch_rows_feed(tmp_path):
    """SFT pads each batch to its longest row: throughput counts those positions, not seq_len."""
    full = token_window_batches(random_tokens(), SEQ, 4, seed=0)
    widths = [SEQ // 4, SEQ // 2, SEQ // 4]

    def narrow(i, rank, world):
        inputs, targets = full(i, rank, world)
        w = widths[i % len(widths)]
        return inputs[:, :w], targets[:, :w]

    cfg = cfg_for(max_steps=6, log_every=3, grad_accum=2)
    sink = ListSink()
    result = train(tiny_model(), cfg, narrow, None, lm_loss, tmp_path, sink, batch_tokens=sft_batch_tokens)
    expected = sum(4 * widths[i % len(widths)] for i in range(6 * 2))
    assert result.tokens_seen == expected < 6 * 2 * 4 * SEQ
    _, seen = sink.series("tokens_seen")
    assert seen[-1] == expected
    # mfu is tokens/s times FLOPs per token over the peak, with the tokens that were fed.
    _, tps = sink.series("tokens_per_s")
    _, mfu = sink.series("mfu")
    assert mfu[0] / tps[0] == pytest.approx(mfu[1] / tps[1])
    default = train(tiny_model(), cfg, narrow, None, lm_loss, tmp_path / "default", ListSink())
    assert default.tokens_seen == 6 * 2 * 4 * SEQ  # without the hook: micro_batch_size * seq_len


class Crash(RuntimeError):
    pass


def _crash_at(batches, micro_index: int):
    def wrapped(i, rank, world):
        if i == micro_index:
            raise Crash(f"simulated crash before micro-batch {i}")
        return batches(i, rank, world)
    return wrapped


@pytest.mark.parametrize("zero", ["zero0", "zero2"])
def test_resume_matches_uninterrupted_run(tmp_path, zero):
    """2N steps straight == N steps, crash, new process state, resume, N more (fp32, CPU)."""
    n = 4
    cfg = cfg_for(max_steps=2 * n, ckpt_every=n, grad_accum=2, zero=zero)
    batches = token_window_batches(random_tokens(), SEQ, cfg.batch.micro_batch_size, seed=3)

    straight_sink = ListSink()
    straight = train(tiny_model(), cfg, batches, None, lm_loss, tmp_path / "a", straight_sink)

    with pytest.raises(Crash):
        train(tiny_model(), cfg, _crash_at(batches, (n + 1) * cfg.batch.grad_accum), None, lm_loss, tmp_path / "b",
              ListSink())
    assert latest_checkpoint_step(tmp_path / "b") == n
    torch.manual_seed(1234)  # the resumed run must not depend on the process' RNG state
    resumed_sink = ListSink()
    resumed_model = tiny_model(seed=99)  # different init: everything must come from the checkpoint
    said: list[str] = []
    resumed = train(resumed_model, cfg, batches, None, lm_loss, tmp_path / "b", resumed_sink, echo=said.append)

    assert resumed.resumed_from == n and resumed.steps == 2 * n
    assert said[0].startswith(f"resuming from step {n} ")  # the user is told before the first step
    assert said[-1].startswith(f"step {2 * n}/{2 * n} ") and "elapsed" in said[-1] and "ETA 0s" in said[-1]
    assert abs(resumed.final_train_loss - straight.final_train_loss) < 1e-5
    _, a = straight_sink.series("loss")
    steps_b, b = resumed_sink.series("loss")
    assert steps_b == list(range(n + 1, 2 * n + 1))
    assert np.allclose(a[n:], b, atol=1e-5, rtol=0)
    assert resumed.tokens_seen == straight.tokens_seen


def test_every_zero_stage_trains_the_same(tmp_path):
    """ZeRO only changes where state lives: in fp32 on one rank every stage gives the same losses."""
    batches = token_window_batches(random_tokens(), SEQ, 4, seed=2)
    losses = {}
    for zero in ("zero0", "zero1", "zero2", "zero3", "zero2_offload"):
        sink = ListSink()
        train(tiny_model(), cfg_for(max_steps=3, grad_accum=2, zero=zero), batches, None, lm_loss, tmp_path / zero,
              sink)
        losses[zero] = sink.series("loss")[1]
        assert (tmp_path / zero / "latest").is_file()
    for zero, values in losses.items():
        assert np.allclose(values, losses["zero0"], atol=1e-5, rtol=0), (zero, values, losses["zero0"])


def test_nan_steps_are_skipped_without_update(tmp_path):
    bad_micro = {2, 3}  # steps 3 and 4 (1-based) get a NaN loss
    snapshots = {}

    def loss_fn(engine, batch):
        i = loss_fn.calls
        loss_fn.calls += 1
        snapshots[i] = [p.detach().clone() for p in engine.module.parameters()]
        loss = lm_loss(engine, batch)
        return loss * float("nan") if i in bad_micro else loss

    loss_fn.calls = 0
    sink = ListSink()
    batches = token_window_batches(random_tokens(), SEQ, 4, seed=0)
    result = train(tiny_model(), cfg_for(max_steps=6, max_bad_steps=3), batches, None, loss_fn, tmp_path, sink)

    assert result.skipped_steps == 2
    skipped = [s for s, m in sink.records if m.get("skipped_step")]
    assert skipped == [3, 4]
    # A skipped step leaves every weight untouched; a normal step changes them.
    assert all(torch.equal(x, y) for x, y in zip(snapshots[2], snapshots[3]))
    assert all(torch.equal(x, y) for x, y in zip(snapshots[3], snapshots[4]))
    assert any(not torch.equal(x, y) for x, y in zip(snapshots[4], snapshots[5]))
    assert math.isfinite(result.final_train_loss)
    assert all(math.isfinite(p.detach().sum().item()) for p in snapshots[5])


def test_too_many_consecutive_nan_steps_fail(tmp_path):
    def loss_fn(engine, batch):
        loss_fn.calls += 1
        loss = lm_loss(engine, batch)
        return loss * float("nan") if loss_fn.calls >= 3 else loss

    loss_fn.calls = 0
    batches = token_window_batches(random_tokens(), SEQ, 4, seed=0)
    with pytest.raises(NonFiniteLossError, match="3 consecutive steps"):
        train(tiny_model(), cfg_for(max_steps=10, max_bad_steps=3), batches, None, loss_fn, tmp_path, ListSink())
    assert loss_fn.calls == 5  # steps 3, 4, 5 were bad: it stopped right there


def test_token_windows_are_pure_and_cover_an_epoch():
    tokens = np.arange(16 * 8 + 1, dtype=np.uint16)  # 8 windows of 16 (+1 target)
    fn = token_window_batches(tokens, 16, 2, seed=5)
    x, y = fn(0, 0, 1)
    assert x.shape == (2, 16) and x.dtype == torch.int64 and torch.equal(y[:, :-1], x[:, 1:])
    # Two ranks of a 2-rank world see disjoint windows; together 2 micro-batches cover the epoch.
    starts = {int(fn(i, r, 2)[0][j, 0]) for i in range(2) for r in range(2) for j in range(2)}
    assert starts == set(range(0, 128, 16))
    fresh = token_window_batches(tokens, 16, 2, seed=5)
    assert torch.equal(fn(7, 1, 2)[0], fresh(7, 1, 2)[0])  # no hidden state: mid-epoch resume is exact
    assert not torch.equal(fn(0, 0, 1)[0], token_window_batches(tokens, 16, 2, seed=6)(0, 0, 1)[0])
    with pytest.raises(ValueError, match="seq_len"):
        token_window_batches(tokens[:10], 16, 2, seed=0)


def test_mlflow_sink_logs_to_a_real_store(tmp_path, monkeypatch):
    import mlflow

    from infra.tracking.runs import stage_run
    from infra.workspace.paths import Workspace

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ws = Workspace(tmp_path / "ws")
    with stage_run(ws, "pretrain") as run:
        MlflowSink(rank=0).log_metrics({"loss": 2.5, "skipped": float("nan")}, step=3)
        MlflowSink(rank=1).log_metrics({"loss": 9.9}, step=4)  # other ranks never write
    history = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(3, 2.5)]


def test_train_config_rejects_bad_values():
    with pytest.raises(ValueError):
        train_config(zero="zero4")
    with pytest.raises(ValueError):
        train_config(max_steps=0)
    with pytest.raises(ValueError):
        train_config(unknown_key=1)


def test_the_deepspeed_op_build_is_announced_only_when_it_is_not_cached(tmp_path, monkeypatch):
    from tasks.training.distributed import _shm_op_built

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert not _shm_op_built()
    (tmp_path / "py311_cpu" / "deepspeed_shm_comm").mkdir(parents=True)
    (tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"\x7fELF")
    assert _shm_op_built()


def test_validation_reports_bits_per_byte_with_the_pretraining_bpb_fn(tmp_path):
    """Pretraining's validation adds val_bpb: the same windows' nats over their UTF-8 bytes (models/bpb.py)."""
    import math

    from models.losses import token_logprobs
    from tasks.training.loop import LossSteps, fit
    from tasks.training.pretrain.stage import lm_nats_and_bytes

    cfg = cfg_for(max_steps=2, eval_batches=2)
    tokens = random_tokens()
    table = torch.arange(SEQ * 0 + 64) % 3  # ids 0, 3, 6, ... are "special" (0 bytes); others 1 or 2 bytes
    batches = token_window_batches(tokens, SEQ, cfg.batch.micro_batch_size, seed=0)
    evals = token_window_batches(tokens, SEQ, cfg.batch.micro_batch_size, seed=1)
    steps = LossSteps(cfg, batches, evals, lm_loss, bpb_fn=lambda m, b: lm_nats_and_bytes(m, b, table))
    sink = ListSink()
    trained = fit(tiny_model(), cfg, steps, None, sink, micro_batch_size=cfg.batch.micro_batch_size, grad_accum=1,
                  seq_len=SEQ)
    model = trained.engine.module.eval()
    nats = n_bytes = 0.0
    with torch.no_grad():
        for i in range(2):
            x, y = evals(i, 0, 1)
            per_token = -token_logprobs(model(x), y)
            weight = table[y]
            nats += float((per_token * (weight > 0)).sum())
            n_bytes += float(weight.sum())
    assert trained.final_val_bpb == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    assert any("val_bpb" in m for _, m in sink.records)


def test_a_signal_saves_the_step_it_stops_at_and_a_resume_continues_there(tmp_path):
    """SIGTERM mid-run (here from the batch function, as a `kill` would arrive): the step finishes, a checkpoint
    of it is written although none is scheduled, and the loop stops; the resume continues from that step."""
    import os
    import signal

    from tasks.training.stop import TrainingStopped

    cfg = cfg_for(max_steps=8, ckpt_every=100, grad_accum=2)
    batches = token_window_batches(random_tokens(), SEQ, cfg.batch.micro_batch_size, seed=3)
    straight = train(tiny_model(), cfg, batches, None, lm_loss, tmp_path / "a", ListSink())

    def signalled(i, rank, world):
        if i == 5:  # the second micro-batch of step 3: that step still completes
            os.kill(os.getpid(), signal.SIGTERM)
        return batches(i, rank, world)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingStopped, match=r"stopped by SIGTERM after step 3 .*continues from step 3"):
        train(tiny_model(), cfg, signalled, None, lm_loss, tmp_path / "b", ListSink())
    assert signal.getsignal(signal.SIGTERM) is before  # the loop's handler lives only while it trains
    assert latest_checkpoint_step(tmp_path / "b") == 3 and checkpoint_tags(tmp_path / "b") == ["step00000003"]
    resumed = train(tiny_model(seed=99), cfg, batches, None, lm_loss, tmp_path / "b", ListSink())
    assert resumed.resumed_from == 3 and resumed.steps == 8
    assert abs(resumed.final_train_loss - straight.final_train_loss) < 1e-5  # the stop changed nothing that was trained
