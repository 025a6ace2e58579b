"""models/memory_plan.py and `llmforge plan`: ZeRO-2/3 model states agree with DeepSpeed's own
estimators, layouts multiply to the device count and DeepSpeed's refusals are refused, the JSON
has its documented shape, and a Hugging Face config.json is read."""
from __future__ import annotations

import functools
import json
import re
import subprocess
import time
import sys

import pytest
import torch

from flows.cli import main
from models.flops import num_params
from models.llama import ModelConfig, Transformer
from models.memory_plan import (GiB, Layout, activation_bytes, check_layout, layouts, load_model, model_from_hf,
                                params_per_device, plan, plan_layout)
from tests.conftest import ROOT

LLAMA_70B = ROOT / "infra" / "presets" / "models" / "llama-2-70b.json"
LLAMA_7B_HF = {  # meta-llama/Llama-2-7b-hf's config.json, the fields that shape it
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
}
LAYOUT_KEYS = {"dp", "tp", "pp", "zero", "params_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes",
               "activations_bytes", "total_bytes", "fits"}


def _configs() -> dict[str, ModelConfig]:
    return {
        "demo": load_model("demo"),
        "gpt124m": load_model("gpt124m"),
        "llama-2-7b": model_from_hf(LLAMA_7B_HF),
        "llama-2-70b": load_model(str(LLAMA_70B)),
    }


CONFIGS = _configs()


@functools.cache
def _deepspeed_counts(name: str) -> tuple[int, int]:
    """(total params, largest module's own params) as deepspeed's model_to_params counts them, on the meta device."""
    with torch.device("meta"):
        model = Transformer(CONFIGS[name])
    total = sum({id(p): p.numel() for p in model.parameters()}.values())  # tied weights once
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


@pytest.mark.parametrize("name", CONFIGS)
def test_parameter_count_matches_the_model(name):
    cfg = CONFIGS[name]
    total, _ = _deepspeed_counts(name)
    assert params_per_device(cfg) == total == num_params(cfg)


@pytest.mark.parametrize("devices", [8, 64])
@pytest.mark.parametrize("name", CONFIGS)
def test_zero2_and_zero3_model_states_agree_with_deepspeed(name, devices):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cfg = CONFIGS[name]
    total, largest = _deepspeed_counts(name)
    ours = {p.zero: p for p in plan(cfg, devices).layouts if p.tp == 1 and p.pp == 1}
    _, ds2 = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=devices, cpu_offload=False)
    _, ds3, _ = estimate_zero3_model_states_mem_needs(total, largest, num_gpus_per_node=devices, cpu_offload=False,
                                                      cpu_offload_params=False)
    assert ours[2].model_states_bytes == pytest.approx(ds2, rel=0.05)
    assert ours[3].model_states_bytes == pytest.approx(ds3, rel=0.05)


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-2-70b"])
def test_agrees_with_what_the_all_cold_estimators_print(name, capsys):
    """The `_all_cold` functions only print (GB of 2**30, two decimals): read their no-offload line."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

    cfg = CONFIGS[name]
    total, largest = _deepspeed_counts(name)
    ours = {p.zero: p for p in plan(cfg, 8).layouts if p.tp == 1 and p.pp == 1}
    capsys.readouterr()
    estimate_zero2_model_states_mem_needs_all_cold(total, num_gpus_per_node=8)
    estimate_zero3_model_states_mem_needs_all_cold(total, largest, num_gpus_per_node=8)
    printed = capsys.readouterr().out
    no_offload = [float(re.search(r"\|\s*([\d.]+)GB \|", line).group(1)) * GiB
                  for line in printed.splitlines() if "offload_param=none, offload_optimizer=none, zero_init=1" in line
                  or line.rstrip().endswith("| offload_optimizer=none")]
    assert len(no_offload) == 2, printed
    assert ours[2].model_states_bytes == pytest.approx(no_offload[0], rel=0.05)
    assert ours[3].model_states_bytes == pytest.approx(no_offload[1], rel=0.05)


@pytest.mark.parametrize("devices", [1, 2, 6, 8, 64])
def test_every_layout_multiplies_to_the_device_count_and_deepspeed_can_run_it(devices):
    cfg = CONFIGS["llama-2-70b"]
    found = layouts(cfg, devices)
    assert found
    for layout in found:
        assert layout.dp * layout.tp * layout.pp == devices
        assert not (layout.pp > 1 and layout.zero >= 2)
        assert cfg.n_heads % layout.tp == 0 and cfg.n_kv_heads % layout.tp == 0
    assert len(set(found)) == len(found)
    # Every runnable combination is there: for 8 devices, tp and pp over {1, 2, 4, 8}.
    if devices == 8:
        assert {(l.tp, l.pp) for l in found} == {(t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if t * p <= 8}


@pytest.mark.parametrize("layout, devices, says", [
    (Layout(dp=2, tp=2, pp=1, zero=1), 8, "dp x tp x pp = 4 but there are 8 devices"),
    (Layout(dp=1, tp=1, pp=2, zero=2), 2, "ZeRO-0 or ZeRO-1 only"),
    (Layout(dp=1, tp=1, pp=2, zero=3), 2, "ZeRO-0 or ZeRO-1 only"),
    (Layout(dp=1, tp=3, pp=1, zero=0), 3, "tp=3 must divide n_heads=6 and n_kv_heads=2"),
    (Layout(dp=1, tp=1, pp=8, zero=0), 8, "pp=8 exceeds the model's 4 layers"),
    (Layout(dp=1, tp=1, pp=1, zero=4), 1, "ZeRO stage 4 does not exist"),
    (Layout(dp=0, tp=1, pp=1, zero=0), 0, "give at least one device"),
])
def test_refusals_name_the_combination(layout, devices, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_layout(CONFIGS["demo"], layout, devices)
    assert layout not in layouts(CONFIGS["demo"], max(devices, 1))


def test_tensor_and_pipeline_parallel_divide_what_they_split():
    cfg = CONFIGS["llama-2-70b"]
    whole = params_per_device(cfg)
    assert params_per_device(cfg, tp=8) == pytest.approx(whole / 8, rel=0.01)  # norms are a rounding error
    # 10 layers, and the last stage's head: a whole vocab x dim matrix, not an eighth of two
    assert params_per_device(cfg, pp=8) == pytest.approx(whole / 8 + 196_608_000, rel=0.001)
    e = 2
    full = activation_bytes(cfg, 4096, 1, tp=1, pp=1, e=e, checkpointed=False)
    assert activation_bytes(cfg, 4096, 1, tp=1, pp=1, e=e, checkpointed=True) < full / 10
    # Without sequence parallelism the norms' activations stay whole: tp 8 saves less than 8x.
    assert full / 8 < activation_bytes(cfg, 4096, 1, tp=8, pp=1, e=e, checkpointed=False) < full / 2
    # 1F1B: the first stage holds pp micro-batches of L/pp layers, as much as one device with all L layers.
    assert activation_bytes(cfg, 4096, 1, tp=1, pp=8, e=e, checkpointed=False) == pytest.approx(full, rel=0.05)


def test_zero_stages_shrink_model_states_and_the_device_memory_decides_fits():
    cfg = CONFIGS["llama-2-7b"]
    by_zero = [plan_layout(cfg, Layout(8, 1, 1, z), 8, 4096) for z in range(4)]
    states = [p.model_states_bytes for p in by_zero]
    assert states == sorted(states, reverse=True)
    assert by_zero[0].model_states_bytes == 20 * num_params(cfg)  # 2 + 2 + 4 + 4 + 8 bytes a parameter
    small = plan(cfg, 8, seq_len=4096, device_mem_bytes=1 * GiB)
    assert not any(p.fits or p.fits_checkpointed for p in small.layouts) and small.fastest is None
    big = plan(cfg, 8, seq_len=4096, device_mem_bytes=80 * GiB)
    assert big.fastest is not None and big.fastest.total_checkpointed_bytes <= 80 * GiB


def test_seventy_b_on_64_gpus_picks_data_parallel_zero3_with_checkpointing():
    result = plan(CONFIGS["llama-2-70b"], 64, seq_len=4096, micro_batch=1)
    best = result.fastest
    assert (best.dp, best.tp, best.pp, best.zero) == (64, 1, 1, 3)
    assert not best.fits and best.fits_checkpointed


def test_hf_config_json_is_read_from_a_file_or_its_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_7B_HF, "num_key_value_heads": 8}), encoding="utf-8")
    for source in (tmp_path / "config.json", tmp_path):
        cfg = load_model(str(source))
        assert (cfg.dim, cfg.ffn_hidden, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.max_seq_len,
                cfg.tie_embeddings) == (4096, 11008, 32, 32, 8, 32000, 4096, False)
    seventy = load_model(str(LLAMA_70B))
    assert (seventy.dim, seventy.ffn_hidden, seventy.n_layers, seventy.n_heads, seventy.n_kv_heads) == (
        8192, 28672, 80, 64, 8)
    assert 68.9e9 < num_params(seventy) < 69.1e9  # Llama-2-70B's published 68.98B


def test_cli_json_shape(capsys):
    assert main(["plan", "--model", "demo", "--devices", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"n_params", "layouts"}
    assert out["n_params"] == num_params(CONFIGS["demo"])
    assert out["layouts"] and all(LAYOUT_KEYS <= set(layout) for layout in out["layouts"])
    for layout in out["layouts"]:
        assert layout["dp"] * layout["tp"] * layout["pp"] == 4
        assert layout["model_states_bytes"] == layout["params_bytes"] + layout["grads_bytes"] + layout["optimizer_bytes"]
        assert layout["total_bytes"] >= layout["model_states_bytes"] + layout["activations_bytes"]
    assert sum(layout["fastest"] for layout in out["layouts"]) == 1


def test_cli_table_names_the_fastest_layout(capsys):
    assert main(["plan", "--model", str(LLAMA_70B), "--devices", "64", "--seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "| dp | tp | pp | zero |" in out
    assert "fastest that fits: dp 64 x tp 1 x pp 1, ZeRO-3 with full activation checkpointing" in out


@pytest.mark.parametrize("args, says", [
    (["--model", "no/such/config.json", "--devices", "8"], "does not exist"),
    (["--model", "gpt9000", "--devices", "8"], "unknown model preset 'gpt9000'"),
    (["--model", "demo", "--devices", "0"], "--devices: 0 must lie in [1, 1e+06]"),
    (["--model", "demo", "--devices", "1000000000000"], "--devices: 1000000000000 must lie in [1, 1e+06]"),
    (["--model", "demo", "--devices", "2", "--device-mem", "-5"], "--device-mem: -5 must lie in"),
    (["--model", "demo", "--devices", "2", "--device-mem", "inf"], "--device-mem: inf must lie in"),
    (["--model", "demo", "--devices", "2", "--device-mem", "nan"], "--device-mem: nan must lie in"),
    (["--model", "demo", "--devices", "2", "--seq-len", "0"], "--seq-len: 0 must lie in"),
    (["--model", "demo", "--devices", "2", "--devices-per-node", "0"], "--devices-per-node: 0 must lie in"),
])
def test_cli_errors_are_one_line_and_exit_2(args, says, capsys):
    try:
        code = main(["plan", *args])
    except SystemExit as exc:  # refused by argparse, as the command line's own errors are
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_the_largest_device_count_plans_in_seconds():
    start = time.perf_counter()
    assert len(layouts(load_model("demo"), 10**6)) > 0
    assert time.perf_counter() - start < 5


def test_the_module_imports_no_torch():
    code = "import sys, models.memory_plan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _saved_activation_bytes(cfg: ModelConfig, dtype: torch.dtype, batch: int, seq_len: int) -> int:
    """Bytes of the tensors autograd saves for backward in one forward + loss (weights left out)."""
    from models.losses import next_token_loss

    torch.manual_seed(0)
    model = Transformer(cfg).to(dtype)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    idx = torch.randint(0, cfg.vocab_size, (batch, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        next_token_loss(model(idx), idx)
    return sum(saved.values())


@pytest.mark.parametrize("dtype, e", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_layer_activations_match_what_autograd_saves(dtype, e):
    """One block's formula against the tensors autograd really keeps (the difference of 4 and 2 layers)."""
    from models.memory_plan import layer_activation_bytes

    cfg = CONFIGS["demo"]
    batch, seq_len = 2, 128
    two, four = (_saved_activation_bytes(cfg.model_copy(update={"n_layers": n}), dtype, batch, seq_len) for n in (2, 4))
    assert layer_activation_bytes(cfg, seq_len, batch, tp=1, e=e) == pytest.approx((four - two) / 2, rel=0.05)



def test_plan_activations_match_a_training_step_on_the_cpu():
    """The single layout's activation figures against one forward and backward of the real model (fp32), measured
    as bench/activation_memory.py measures them: the CPU allocator's peak over the step (torch's profiler, the
    gradients left out) within 20%, without and with full checkpointing; and what autograd saves for backward
    against the plan less the head's two backward gradients (8 sbV, allocated in backward), within 20%."""
    from bench.activation_memory import allocator_timeline, checkpoint_blocks, saved_bytes, weight_storages
    from models.losses import next_token_loss

    cfg = ModelConfig(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=176, max_seq_len=128)
    batch, seq_len = 4, 128
    idx = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only contend on a shared machine
    try:
        for checkpointed in (False, True):
            torch.manual_seed(0)
            model = Transformer(cfg)
            if checkpointed:
                checkpoint_blocks(model)

            def step() -> None:
                next_token_loss(model(idx), idx).backward()
                for p in model.parameters():
                    p.grad = None

            step()  # warm-up
            planned = activation_bytes(cfg, seq_len, batch, tp=1, pp=1, e=4, checkpointed=checkpointed)
            peak = allocator_timeline(step, list(model.parameters()))["alloc_peak_without_grads_bytes"]
            assert planned == pytest.approx(peak, rel=0.2), f"checkpointed={checkpointed}"
            if not checkpointed:
                held = planned - 8 * seq_len * batch * cfg.vocab_size
                assert held == pytest.approx(saved_bytes(step, weight_storages(model)), rel=0.2)
    finally:
        torch.set_num_threads(threads)
