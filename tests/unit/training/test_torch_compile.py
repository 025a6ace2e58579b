"""torch_compile: the engine compiles the model in place (same state-dict keys); off by default."""
from __future__ import annotations

import pytest

from tasks.training.batches import token_window_batches
from tasks.training.config import RESUME_NEUTRAL
from tasks.training.engine import build_engine
from tasks.training.metrics import ListSink
from tasks.training.pretrain.stage import lm_loss
from tests.conftest import TINY_SEQ, loop_model, random_tokens, train_config, train_config_for
from tests.helpers.training import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_flag_reaches_the_engine_and_keeps_the_state_dict_keys():
    assert train_config().launch.torch_compile is False and "launch.torch_compile" in RESUME_NEUTRAL
    for flag in (False, True):
        model = loop_model()
        keys = list(model.state_dict())
        cfg = train_config_for(torch_compile=flag)
        assert cfg.launch.torch_compile is flag
        engine = build_engine(model, cfg.optim, cfg.launch, cfg.batch.micro_batch_size, cfg.batch.grad_accum, cfg.steps)
        assert engine.is_compiled is flag
        assert list(engine.module.state_dict()) == keys  # checkpoints and exports read the same names


@pytest.mark.slow  # inductor compiles C++ kernels for the CPU: about a minute on 2 busy cores
def test_a_compiled_model_trains_like_an_eager_one(tmp_path):
    losses = {}
    for flag in (False, True):
        cfg = train_config_for(max_steps=3, eval_batches=0, torch_compile=flag)
        sink = ListSink()
        batches = token_window_batches(random_tokens(), TINY_SEQ, cfg.batch.micro_batch_size, seed=0)
        train(loop_model(), cfg, batches, None, lm_loss, tmp_path / f"ckpt-{flag}", sink)
        losses[flag] = sink.series("loss")[1]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
