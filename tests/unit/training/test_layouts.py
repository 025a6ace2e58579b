"""Launch layouts (launch.dp x tp x pp): validation, the rank arithmetic, the model splits in one process."""
from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tasks.training.config import LaunchConfig, PretrainConfig, SftConfig
from tasks.training.parallel import RankLayout


def test_layout_must_multiply_to_the_world_size(tmp_path):
    assert LaunchConfig(num_procs=2, tp=2).data_parallel == 1
    assert LaunchConfig(num_procs=4, pp=2).data_parallel == 2
    assert LaunchConfig(num_procs=2, dp=2).data_parallel == 2
    with pytest.raises(ValidationError, match=r"dp=auto x tp=2 x pp=1 .*world size 3"):
        LaunchConfig(num_procs=3, tp=2)
    with pytest.raises(ValidationError, match=r"dp=2 x tp=2 x pp=1 .*world size 2"):
        LaunchConfig(num_procs=2, dp=2, tp=2)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=2\n# a comment\nb slots=2\n")
    assert LaunchConfig(num_procs=2, hostfile=hostfile, tp=2).data_parallel == 2  # 2 nodes x 2 ranks


def test_combinations_deepspeed_cannot_run_are_named():
    with pytest.raises(ValidationError, match=r"pp=2 with zero=zero3: DeepSpeed's pipeline engine runs ZeRO-0 or ZeRO-1"):
        LaunchConfig(num_procs=2, pp=2, zero="zero3")
    with pytest.raises(ValidationError, match=r"zero=zero2: DeepSpeed's pipeline"):
        LaunchConfig(num_procs=2, pp=2, zero="zero2")
    LaunchConfig(num_procs=2, pp=2, zero="zero1")
    with pytest.raises(ValidationError, match=r"tp=2 .* with zero=zero1: tensor-parallel weights"):
        LaunchConfig(num_procs=2, tp=2, zero="zero1")
    with pytest.raises(ValidationError, match="not built yet"):
        LaunchConfig(num_procs=4, tp=2, pp=2)
    with pytest.raises(ValidationError, match="pipeline parallelism trains pretraining only"):
        SftConfig(launch={"num_procs": 2, "pp": 2})


def test_rank_layout_cuts_data_by_replica():
    # tp: (dp, tp) row-major, a replica's tp ranks share data.
    assert [RankLayout(2, 2, 1, r).data_rank for r in range(4)] == [0, 0, 1, 1]
    # pp: DeepSpeed's (pipe, data) row-major, a replica's stages share data.
    assert [RankLayout(2, 1, 2, r).data_rank for r in range(4)] == [0, 1, 0, 1]
    assert [RankLayout(2, 1, 1, r).data_rank for r in range(2)] == [0, 1]
    launch = LaunchConfig(num_procs=2, tp=2)
    assert RankLayout.of(launch, 1, 2) == RankLayout(1, 2, 1, 1)
    assert RankLayout.of(launch, 0, 4) == RankLayout(2, 2, 1, 0)  # dp unset: whatever tp and pp leave
    with pytest.raises(ValueError, match="does not fit the 4 ranks"):
        RankLayout.of(LaunchConfig(num_procs=2, dp=1, tp=2), 0, 4)


def test_tensor_parallel_refuses_heads_it_cannot_split():
    """When the config is read, before any stage or rank (issue 52); the stage's own check stays behind it."""
    from tests.conftest import tiny_pretrain_config

    cfg = tiny_pretrain_config(num_procs=2)  # n_heads=2, n_kv_heads=1
    with pytest.raises(ValueError, match=r"launch.tp=2 does not divide the model's n_kv_heads=1.*choose a tp"):
        PretrainConfig.model_validate({**cfg.model_dump(), "launch": {**cfg.launch.model_dump(), "tp": 2}})


def test_pipeline_layers_hold_the_whole_models_weights_and_give_them_back():
    """One stage (the whole pipeline in one process): same logits as the Transformer, same state dict back."""
    import torch.distributed as dist

    from models.llama import Transformer, model_config
    from models.losses import next_token_loss
    from models.pipeline import pipe_state_dict, pipeline_module
    from tasks.training.distributed import init_distributed

    init_distributed()
    torch.manual_seed(0)
    whole = Transformer(model_config("demo", 64, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64,
                                     max_seq_len=16))
    pipe = pipeline_module(whole, 1, next_token_loss)
    x = torch.randint(0, 64, (2, 16))
    out = x
    for layer in pipe.forward_funcs:
        out = layer(out)
    torch.testing.assert_close(out, whole(x))
    state = pipe_state_dict(pipe)
    assert set(state) == set(whole.state_dict()) - {"lm_head.weight"}  # the tied head is the embedding
    for k, v in state.items():
        torch.testing.assert_close(v, whole.state_dict()[k])
    assert dist.is_initialized()


def test_layout_and_memory_reach_mlflow_and_the_report_card(tmp_path):
    from tasks.reports.card import memory_row
    from tasks.training.pretrain.stage import PretrainResult
    from tasks.training.stage import memory_metrics

    memory = {"layout": "dp1_tp2_pp1", "world_size": 2, "plan_bytes_per_device": 3 * 2**20,
              "peak_bytes_per_rank": [500 * 2**20, 510 * 2**20]}
    assert memory_metrics(memory) == {"plan_bytes_per_device": 3 * 2**20, "peak_bytes_max_rank": 510 * 2**20,
                                      "peak_bytes_rank0": 500 * 2**20, "peak_bytes_rank1": 510 * 2**20}
    base = PretrainResult(out_dir=tmp_path, model_dir=tmp_path, hf_dir=None, mlflow_run_id=None, checkpoint=None,
                          loss_curve=None, steps=1, final_train_loss=1.0, final_val_loss=None, final_val_ppl=None, tokens_seen=1,
                          train_tokens_per_s=None, skipped_steps=0, world_size=2, n_params=1, layout="dp1_tp2_pp1",
                          world_size_used=2, plan_bytes_per_device=3 * 2**20,
                          peak_bytes_per_rank=[500 * 2**20, 510 * 2**20])
    assert memory_row(base) == ("| pretraining layout, 2 ranks: memory plan's estimate per device; measured peak per "
                                "rank (on the CPU: RSS, with Python, torch and the data) | dp1_tp2_pp1: 3 MiB; "
                                "500 / 510 MiB |")
    assert memory_row(base.model_copy(update={"layout": None})) is None
