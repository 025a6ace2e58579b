"""DeepSpeed JSON configs, the launcher command, and real multi-rank runs through the `deepspeed` launcher."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from infra.launch.launcher import (ZERO_STAGES, build_ds_config, launch, launch_command, launch_env, load_zero_json,
                                   resolve_precision, runner_command)
from tests.conftest import ROOT, launch_into, tiny_pretrain_config
from tests.helpers.references import zero2_two_rank  # noqa: F401 - the shared 2-rank ZeRO-2 run


@pytest.mark.parametrize("zero", ZERO_STAGES)
def test_ds_config_merges_run_settings(zero):
    ds = build_ds_config(zero, "fp32", micro_batch_size=3, grad_accum=5, grad_clip=0.7)
    assert ds["train_micro_batch_size_per_gpu"] == 3
    assert ds["gradient_accumulation_steps"] == 5
    assert ds["gradient_clipping"] == 0.7
    assert ds["bf16"] == {"enabled": False} and ds["fp16"] == {"enabled": False}
    assert ds["steps_per_print"] >= 10**6
    assert "optimizer" not in ds and "scheduler" not in ds  # we pass our own
    expected_stage = {"zero0": 0, "zero1": 1, "zero2": 2, "zero3": 3, "zero2_offload": 2}[zero]
    assert ds["zero_optimization"]["stage"] == expected_stage
    assert "train_batch_size" not in ds  # DeepSpeed derives it from the world size
    json.dumps(ds)  # what run_pretrain writes to out_dir


def test_offload_config_accepts_our_optimizer_on_cpu():
    ds = build_ds_config("zero2_offload", "fp32", 8, 1, 1.0)
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["zero_force_ds_cpu_optimizer"] is False
    if not torch.cuda.is_available():
        assert ds["zero_optimization"]["offload_optimizer"]["pin_memory"] is False


def test_precision():
    assert build_ds_config("zero1", "bf16", 8, 1, 1.0)["bf16"] == {"enabled": True}
    assert resolve_precision("fp32") == "fp32"
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp8")


def test_unknown_stage_names_the_choices():
    with pytest.raises(ValueError, match="zero2_offload"):
        load_zero_json("zero4")


def test_the_runner_is_deepspeeds_without_mlflow():
    """infra.launch.runner runs the `deepspeed` script's runner (its own --help), and neither it nor a rank's
    import_deepspeed imports MLflow, which DeepSpeed's autotuner would."""
    probe = ("import sys; from infra.launch.runner import import_deepspeed; "
             "runner = import_deepspeed('deepspeed.launcher.runner'); "
             "print('mlflow' in sys.modules, runner.__name__); import mlflow; print(mlflow.__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "deepspeed.launcher.runner", "mlflow"]
    help_text = subprocess.run([*runner_command(), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert help_text.returncode == 0 and "--num_gpus" in help_text.stdout and "--hostfile" in help_text.stdout
    # The per-node launcher the runner starts: DeepSpeed's launch.py (its own --help), without MLflow too.
    node = subprocess.run([*runner_command(), "--node-launcher", "--help"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert node.returncode == 0 and "--world_info" in node.stdout and "--node_rank" in node.stdout, node.stderr[-2000:]
    probe = ("import sys; from infra.launch.runner import import_deepspeed; "
             "launch = import_deepspeed('deepspeed.launcher.launch'); print('mlflow' in sys.modules, launch.__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.split() == ["False", "deepspeed.launcher.launch"], out.stderr[-2000:]


def test_the_runner_starts_its_node_launcher_through_ours():
    """The local launch, and DeepSpeed's own pdsh command and the `pkill -f` its stop sends (multinode_runner.py)."""
    import collections

    from infra.launch.runner import import_deepspeed, node_launcher

    local = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "--master_port=29500",
             "--module", "tasks.training.rank", "--job", "j.json"]
    assert node_launcher(local) == [sys.executable, "-u", "-m", "infra.launch.runner", "--node-launcher",
                                    *local[4:]]
    runner = import_deepspeed("deepspeed.launcher.runner")
    from deepspeed.launcher.multinode_runner import PDSHRunner

    args = runner.parse_args(["--num_gpus", "1", "--master_port", "29500", "--no_local_rank", "--module",
                              "tasks.training.rank", "--job", "j.json"])
    args.master_addr = "127.0.0.1"
    cmd, kill, _ = PDSHRunner(args, "e30=").get_cmd({}, collections.OrderedDict([("node1", 1), ("node2", 1)]))
    ours = node_launcher(cmd)
    at = ours.index(sys.executable)
    assert ours[at:at + 5] == [sys.executable, "-u", "-m", "infra.launch.runner", "--node-launcher"]
    assert ours[at + 5:] == cmd[at + 4:]
    # The stop's pattern (a regex, its spaces escaped) finds the launcher as it now runs on each node.
    pattern = node_launcher(kill)[-1]
    assert kill[:-1] == node_launcher(kill)[:-1] and re.search(pattern, " ".join(ours[at:])), pattern
    assert not re.search(kill[-1], " ".join(ours[at:]))  # DeepSpeed's own pattern would miss it
    for other in (["pkill", "-f", "deepspeed.launcher.launch"], "a string", b"bytes"):
        assert node_launcher(other) is other


def test_the_runners_log_says_the_command_as_started():
    """DeepSpeed's runner logs `cmd = ...` before its Popen: the command as rewritten follows it in its log."""
    import logging

    from infra.launch.runner import _Popen

    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logger = logging.getLogger("DeepSpeed")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        assert _Popen(["true", "-u", "-m", "deepspeed.launcher.launch", "--job", "j.json"]).wait() == 0
        assert _Popen(["true", "nothing to rewrite"]).wait() == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert logged == ["cmd as started (infra/launch/runner.py): true -u -m infra.launch.runner --node-launcher "
                      "--job j.json"]


def test_launch_command(tmp_path):
    cmd = launch_command("tasks.training.rank", ["--job", "j.json"], num_procs=2, master_port=29555)
    assert cmd[:3] == [sys.executable, "-m", "infra.launch.runner"]
    assert cmd[cmd.index("--num_gpus") + 1] == "2"
    assert cmd[cmd.index("--master_port") + 1] == "29555"
    assert cmd[cmd.index("--module") + 1] == "tasks.training.rank"
    assert cmd[-2:] == ["--job", "j.json"] and "--no_local_rank" in cmd and "--hostfile" not in cmd
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=8\nnode2 slots=8\n")
    multi = launch_command("m", [], num_procs=8, hostfile=hostfile)
    assert multi[multi.index("--hostfile") + 1] == str(hostfile)
    with pytest.raises(FileNotFoundError, match="hostfile"):
        launch_command("m", [], hostfile=tmp_path / "missing")
    with pytest.raises(ValueError, match="num_procs"):
        launch_command("m", [], num_procs=0)


def test_launch_env(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = launch_env(2, {"EXTRA": "x"})
    assert "RANK" not in env and "MASTER_PORT" not in env  # the launcher assigns them per rank
    assert env["EXTRA"] == "x"
    if not torch.cuda.is_available():
        assert env["DS_ACCELERATOR"] == "cpu"
        assert int(env["OMP_NUM_THREADS"]) >= 1


@pytest.mark.slow
def test_launch_streams_output_and_reports_failure(tmp_path):
    lines: list[str] = []
    launch("platform", [], num_procs=1, log=lines.append, log_file=tmp_path / "launch.log")
    assert any("Linux" in line or "Darwin" in line for line in lines)
    # DeepSpeed's INFO lines ("Setting CUDA_VISIBLE_DEVICES=0" on a CPU) are in the stage's log file only.
    logged = (tmp_path / "launch.log").read_text().splitlines()
    assert any("] [INFO] [" in line and "CUDA_VISIBLE_DEVICES" in line for line in logged)
    assert not any("] [INFO] [" in line for line in lines)
    assert [line for line in logged if "] [INFO] [" not in line] == lines[1:]  # lines[0] names the file
    with pytest.raises(RuntimeError, match=r"(?s)json\.tool.*exit code.*last \d+ lines.*x\.json"):
        launch("json.tool", ["/nonexistent/x.json"], num_procs=1, log=lambda line: None)


# ----------------------------------------------------------------------------- 2-rank pretraining


@pytest.mark.slow
def test_two_rank_zero2_pretraining_through_the_launcher(zero2_two_rank):  # noqa: F811
    """The shared 2-rank ZeRO-2 run (tests/helpers/references.py; test_multinode compares with it)."""
    import mlflow

    from infra.tracking.store import tracking_uri
    from infra.workspace.paths import Workspace
    from models.export import load_model

    vocab = 120
    ref = zero2_two_rank
    assert ref.cfg.checkpoint.every == 3 and ref.cfg.log.every == 1
    result, out, lines = ref.result, ref.out, ref.lines

    assert result.world_size == 2 and result.steps == 6
    assert result.tokens_seen == 6 * 4 * 16 * 2
    assert result.final_train_loss is not None and result.final_val_loss is not None
    assert result.final_val_ppl == pytest.approx(float(np.exp(result.final_val_loss)))
    # ZeRO-2 checkpoint: one optimizer-state partition per rank, plus the model states.
    ckpt = out / "checkpoints" / "step00000006"
    assert result.checkpoint == ckpt and (out / "checkpoints" / "latest").read_text().strip() == ckpt.name
    assert len(list(ckpt.glob("zero_pp_rank_0_*optim_states.pt"))) == 1
    assert len(list(ckpt.glob("zero_pp_rank_1_*optim_states.pt"))) == 1
    assert list(ckpt.glob("mp_rank_00_model_states.pt"))
    # Exported model loads and runs; configs and plots are in out_dir.
    model = load_model(result.model_dir)
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, vocab)
    assert (result.hf_dir / "config.json").is_file()
    assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["stage"] == 2
    assert json.loads((out / "pretrain_config.json").read_text())["model"]["vocab_size"] == vocab
    assert result.loss_curve is not None and result.loss_curve.stat().st_size > 1000
    assert any("step 6/6" in line for line in lines)  # rank 0's progress streamed back
    # Rank 0 logged to MLflow.
    # A client of its own: mlflow.set_tracking_uri would export the URI to os.environ for every later test.
    history = mlflow.tracking.MlflowClient(tracking_uri(Workspace(ref.ws))).get_metric_history(
        result.mlflow_run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3, 4, 5, 6]


def test_pretrain_rejects_bad_settings_before_launching(tmp_path, pretrain_inputs):
    from tasks.training.pretrain.stage import Pretrain

    tokenizer, tokens = pretrain_inputs
    inputs = {"tokens": tokens, "tokenizer": tokenizer}
    with pytest.raises(ValueError, match="max_seq_len"):
        launch_into(Pretrain(tiny_pretrain_config(seq_len=32)), tmp_path / "a", tmp_path, **inputs)
    assert not (tmp_path / "a" / "job.json").exists()
    with pytest.raises(ValueError, match="unknown model preset"):
        launch_into(Pretrain(tiny_pretrain_config(model="huge")), tmp_path / "a", tmp_path, **inputs)


def test_pretrain_refuses_to_resume_a_different_run(tmp_path, pretrain_inputs):
    from tasks.training.pretrain.stage import Pretrain, resolve_model_config

    tokenizer, tokens = pretrain_inputs
    out = tmp_path / "out"
    old = tiny_pretrain_config(lr=1e-3)
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step00000003")
    (out / Pretrain.config_file).write_text(json.dumps({"pretrain": old.model_dump(mode="json"),
                                               "model": resolve_model_config(old, 120)}))
    with pytest.raises(ValueError, match=r"different settings \(optim.lr\)"):
        launch_into(Pretrain(tiny_pretrain_config(lr=2e-3)), out, tmp_path, tokens=tokens, tokenizer=tokenizer)
