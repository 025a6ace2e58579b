"""A config is refused when it is loaded, not hours later: non-finite floats, unknown rewards,
bad hostfiles, and presets that are neither a preset name nor a YAML file where one belongs."""
from __future__ import annotations

import re

import pytest

from flows.cli import main
from flows.config import (CHECKOUT, PRESETS_DIR, load_pipeline_config, preset_path, resolve_data_config,
                          resolve_pipeline_config)
from infra.config import ConfigError
from tasks.data.catalog import load_catalog
from tasks.eval.rewards import REWARDS


def refused(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        resolve_pipeline_config(None, "tiny", overrides)
    return str(err.value)


# ----------------------------------------------------------------------------- finite floats


@pytest.mark.parametrize("override, key", [
    ("pretrain.optim.lr=1e400", "pretrain.optim.lr"),  # PyYAML reads 1e400 as a string; float() makes it inf
    ("pretrain.optim.lr=.inf", "pretrain.optim.lr"),
    ("sft.optim.lr=nan", "sft.optim.lr"),
    ("data.near.threshold=.nan", "data.near.threshold"),
    ("pretrain.log.peak_flops=.inf", "pretrain.log.peak_flops"),  # float | None
    ("pretrain.optim.betas=[0.9, .inf]", "pretrain.optim.betas.1"),  # tuple[float, float]
    ("grpo.rewards={format: .inf}", "grpo.rewards.format"),  # dict[str, float]
    ("grpo.optim.lr=-.inf", "grpo.optim.lr"),
    ("pretrain.model_overrides={rope_theta: .nan}", "pretrain.model_overrides.rope_theta.float"),
])
def test_non_finite_floats_are_refused(override, key):
    msg = refused([override])
    assert f"key '{key}': Input should be a finite number" in msg, msg


def test_catalog_weights_must_be_finite(tmp_path):
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "docs.yaml").write_text(
        "name: docs\nkind: builtin\nbuiltin: python_docs\nlicence: PSF-2.0\nweight: .inf\nmax_epochs: .inf\n")
    with pytest.raises(ConfigError) as err:
        load_catalog(catalog)
    msg = str(err.value)
    assert "docs.yaml" in msg and "key 'weight': Input should be a finite number" in msg and "key 'max_epochs'" in msg


# ----------------------------------------------------------------------------- rewards


@pytest.mark.parametrize("override, key", [
    ("grpo.rewards={nonexistent: 1.0}", "grpo.rewards"),
    ("grpo.rewards={format: 0.1, arithmetc_exact: 1.0}", "grpo.rewards"),
    ("grpo.accuracy_reward=nonexistent", "grpo.accuracy_reward"),
    ("eval.reward=nonexistent", "eval.reward"),
])
def test_unknown_rewards_are_refused_listing_the_registered_ones(override, key):
    msg = refused([override])
    assert f"{key} names unknown reward(s)" in msg and str(sorted(REWARDS)) in msg, msg


def test_rewards_need_one_entry_and_known_ones_pass():
    assert "grpo.rewards is empty; give at least one {name: weight}" in refused(["grpo.rewards={}"])
    cfg = resolve_pipeline_config(None, "tiny", ["grpo.rewards={format: 0.5}", "grpo.accuracy_reward=format",
                                                 "grpo.abstain_guidance=0"])
    assert cfg.grpo.rewards == {"format": 0.5}


def test_a_rewards_map_without_the_right_answers_reward_is_refused_and_one_reward_can_change():
    msg = refused(["grpo.rewards={abstain: 2.0}"])
    assert "has no reward for a right answer (arithmetic_exact" in msg and "--set grpo.rewards.abstain=0.3" in msg
    cfg = resolve_pipeline_config(None, "tiny", ["grpo.rewards.abstain=0.5"])  # one key: the others stay
    assert cfg.grpo.rewards == {"arithmetic_exact": 1.0, "format": 0.1, "abstain": 0.5}


# ----------------------------------------------------------------------------- hostfiles


@pytest.mark.parametrize("section", ["pretrain", "sft"])
def test_a_deepspeed_hostfile_is_accepted(tmp_path, section):
    f = tmp_path / "hostfile"
    f.write_text("# two nodes\nworker-0 slots=8\n\n  worker-1\tslots=4   # the small one\n")
    cfg = resolve_pipeline_config(None, "tiny", [f"{section}.launch.hostfile={f}"])
    assert getattr(cfg, section).launch.hostfile == f


@pytest.mark.parametrize("text, why", [
    (None, "file not found"),
    ("worker-0 slots=8\nworker-1\n", "line 2 'worker-1' is not '<host> slots=<N>'"),
    ("worker-0 slots=0\n", "line 1 'worker-0 slots=0'"),
    ("worker-0 slots=8gpus\n", "line 1"),
    ("worker-0 slots=8\nworker-0 slots=8\n", "line 2: host 'worker-0' is already listed on line 1"),
    ("# nothing\n\n", "lists no nodes"),
])
def test_a_bad_hostfile_is_refused_naming_file_and_line(tmp_path, text, why):
    f = tmp_path / "hostfile"
    if text is not None:
        f.write_text(text)
    msg = refused([f"pretrain.launch.hostfile={f}"])
    assert f"key 'pretrain.launch.hostfile': hostfile {f}: {why}" in msg and "'<host> slots=<N>' with N >= 1" in msg, msg


def test_etc_passwd_is_not_a_hostfile():
    msg = refused(["sft.launch.hostfile=/etc/passwd"])
    assert "hostfile /etc/passwd: line 1 " in msg and "is not '<host> slots=<N>'" in msg, msg
    assert "hostfile /etc: not a regular file" in refused(["sft.launch.hostfile=/etc"])


# ----------------------------------------------------------------------------- presets


@pytest.mark.parametrize("preset", ["../../etc/passwd", "/etc/passwd", "tiny/../../x", "no_such_preset", "tiny.txt", ""])
def test_a_preset_must_be_a_name_or_a_yaml_file(preset):
    with pytest.raises(ConfigError, match=re.escape("known presets: ['gpt-124m', 'tiny']")):
        load_pipeline_config(preset)
    with pytest.raises(ConfigError, match=re.escape("known presets: ['gpt-124m', 'tiny']")):
        resolve_pipeline_config(None, preset, None)


def test_flow_presets_lie_in_the_checkout_or_the_workspace(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    tiny = (PRESETS_DIR / "tiny.yaml").read_text()
    (work / "mine.yaml").write_text(tiny)
    outside = tmp_path / "outside.yml"
    outside.write_text(tiny)
    (work / "link.yaml").symlink_to(outside)
    (work / "dir.yaml").mkdir()

    assert resolve_pipeline_config(None, "tiny", None, workdir=work) == load_pipeline_config("tiny")
    assert resolve_pipeline_config(None, str(PRESETS_DIR / "tiny.yaml"), None, workdir=work).name == "tiny"
    assert resolve_pipeline_config(None, str(work / "mine.yaml"), None, workdir=work).name == "tiny"
    assert resolve_data_config(None, str(work / "mine.yaml"), None, workdir=work) == load_pipeline_config("tiny").data
    for bad in (outside, work / "link.yaml"):
        with pytest.raises(ConfigError, match=re.escape(f"{outside} is outside the checkout and the workspace ({CHECKOUT}, {work})")):
            resolve_pipeline_config(None, str(bad), None, workdir=work)
        with pytest.raises(ConfigError, match="outside the checkout"):
            resolve_data_config(None, str(bad), None, workdir=work)
    with pytest.raises(ConfigError, match="not a regular file"):
        resolve_pipeline_config(None, str(work / "dir.yaml"), None, workdir=work)
    # The CLI's --preset names the user's own file, which may lie anywhere.
    assert load_pipeline_config(str(work / "link.yaml")).name == "tiny"
    assert preset_path("tiny", within=[CHECKOUT]) == PRESETS_DIR / "tiny.yaml"


# ----------------------------------------------------------------------------- what the CLI says


@pytest.mark.parametrize("args, expected", [
    (["--set", "pretrain.optim.lr=1e400"], "key 'pretrain.optim.lr': Input should be a finite number (got '1e400')"),
    (["--set", "grpo.rewards={nonexistent: 1.0}"], "grpo.rewards names unknown reward(s) ['nonexistent']; registered rewards:"),
    (["--set", "pretrain.launch.hostfile=/etc/passwd"], "hostfile /etc/passwd: line 1"),
    (["--preset", "../../etc/passwd"], "preset '../../etc/passwd' is neither a preset name"),
    (["--set", "name=[&a 1, *a]"], "line 1: YAML anchor '&a' is not accepted"),
])
def test_show_config_refuses_with_the_message(capsys, args, expected):
    assert main(["show-config", *args]) == 2
    err = capsys.readouterr().err
    assert expected in err, err


# ----------------------------------------------------------------------------- renamed keys


@pytest.mark.parametrize("old, new", [
    ("pretrain.train.lr=0.1", "pretrain.optim.lr"),
    ("sft.max_steps=3", "sft.steps"),
    ("grpo.ckpt_every=5", "grpo.checkpoint.every"),
    ("sft.torch_threads=1", "sft.launch.torch_threads"),
    ("pretrain.tokenizer.vocab_size=512", "tokenizer.vocab_size"),
    ("grpo.max_operand=9", "arithmetic.max_operand"),
    ("sft.data.arithmetic.ops=+", "arithmetic.ops"),
    ("sft.data.arithmetic.abstain_max_operand=40", "arithmetic.abstain_max_operand"),
    ("eval.train_max_operand=9", "arithmetic.max_operand"),
    ("eval.arithmetic_max_operand=40", "arithmetic.outer_max_operand"),
    ("eval.max_answer_tokens=8", "eval.max_new_tokens"),
])
def test_an_old_key_names_its_new_one(old, new):
    msg = refused([old])
    assert f"key '{old.split('=')[0]}' is now '{new}'" in msg, msg


def test_an_old_key_in_a_preset_file_names_its_new_one(tmp_path):
    from flows.config import load_pipeline_config

    preset = tmp_path / "old.yaml"
    preset.write_text("pretrain:\n  train:\n    max_steps: 3\n")
    with pytest.raises(ConfigError, match=r"old.yaml: key 'pretrain.train.max_steps' is now 'pretrain.steps'"):
        load_pipeline_config(str(preset))


def test_every_training_stage_has_the_same_component_keys():
    cfg = resolve_pipeline_config(None, "tiny", ["pretrain.optim.lr=0.01", "sft.optim.lr=0.02", "grpo.optim.lr=0.03",
                                                 "sft.launch.num_procs=2", "grpo.checkpoint.every=7"])
    assert (cfg.pretrain.optim.lr, cfg.sft.optim.lr, cfg.grpo.optim.lr) == (0.01, 0.02, 0.03)
    assert cfg.sft.launch.num_procs == 2 and cfg.grpo.checkpoint.every == 7
    # A stage's own defaults survive a partial component: SFT keeps no weight decay, GRPO a constant lr.
    assert cfg.sft.optim.weight_decay == 0.0 and cfg.grpo.optim.schedule == "constant"


def test_an_old_arithmetic_key_in_an_sft_source_names_the_pipelines_section():
    from tasks.training.sft.data import SftSourceConfig

    with pytest.raises(ValueError, match="key 'max_operand' of the arithmetic SFT options is now the pipeline's "
                                         "'arithmetic.max_operand'"):
        SftSourceConfig(name="a", kind="sft_builtin", builtin="arithmetic", licence="CC0-1.0",
                        arithmetic={"n": 10, "max_operand": 9})


def test_the_arithmetic_range_is_one_section_every_stage_reads():
    cfg = resolve_pipeline_config(None, "tiny", ["arithmetic.abstain_max_operand=40"])
    assert (cfg.arithmetic.max_operand, cfg.arithmetic.abstain_max_operand, cfg.arithmetic.outer_max_operand) == (31, 40, 40)
    assert "max_operand" not in cfg.grpo.model_dump() and "arithmetic_max_operand" not in cfg.eval.model_dump()
    with pytest.raises(ConfigError, match="abstain_max_operand=31 must lie above arithmetic.max_operand=31"):
        resolve_pipeline_config(None, "tiny", ["arithmetic.abstain_max_operand=31"])
    with pytest.raises(ConfigError, match="n=612, but only 247 sums of the sft split"):  # the preset's SFT set: 612
        resolve_pipeline_config(None, "tiny", ["arithmetic.max_operand=20"])
    with pytest.raises(ConfigError, match="grpo.abstain_n=100 asks for sums answered"):
        resolve_pipeline_config(None, "tiny", ["arithmetic.abstain_max_operand=null", "sft.data.arithmetic.abstain_n=0",
                                               "sft.data.arithmetic.val_abstain_n=0"])


@pytest.mark.parametrize("override, says", [
    ("grpo.abstain_n=100000000", "grpo.abstain_n=100000000, but only"),
    ("grpo.n_train_problems=100000", "grpo.n_train_problems=100000, but only"),
    ("grpo.eval_prompts=100000", "grpo.eval_prompts=100000, but only"),
    ("scale.depths=[]", "scale.depths=[] must name at least one depth"),
    ("scale.depths=[1000]", "scale.sizes_per_budget=4 exceeds the 1 family members"),
    ("scale.predict_factor=1e300", "less than or equal to 1000"),
    ("mix.confirm_scale=1e30", "less than or equal to 1000"),
    ("pretrain.model_overrides={dim: 130}", "dim=130 must be divisible by n_heads=6"),
    ("pretrain.model_overrides={n_layers: -2}", "n_layers=-2 must be a positive integer"),
    ("pretrain.model_overrides={foo: 3}", "['foo']: no such key of a model's shape"),
    ("pretrain.model_overrides={vocab_size: 3}", "the vocabulary is tokenizer.vocab_size"),
    ("pretrain.batch.seq_len=1000", "pretrain.batch.seq_len=1000 exceeds the model's max_seq_len=256"),
    ("sft.batch.seq_len=1000", "sft.batch.seq_len=1000 exceeds the model's max_seq_len=256"),
    ("registered_model=bad/name:x", "MLflow's registry takes a non-empty name without '/'"),
])
def test_what_the_task_and_the_sweep_cannot_give_is_refused_when_the_config_is_read(override, says):
    assert says in refused([override])
