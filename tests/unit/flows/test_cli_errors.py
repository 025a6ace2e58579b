"""CLI errors are one line that names the input that was wrong: a misspelled `--set` key is blamed on the
`--set` with the closest keys; a bad `--set` value on the `--set`, a bad preset value on the preset;
`show-config` refuses a catalog that does not exist; `data --catalog nope/` says so at once."""
from __future__ import annotations

import re
import subprocess
import time

import pytest

from flows.cli import main
from flows.config import PipelineConfig, check_override_keys, load_pipeline_config
from infra.config import ConfigError, config_keys
from tests.conftest import CLI, ROOT


def _error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_a_misspelled_set_key_is_blamed_on_the_set_with_the_closest_keys(capsys):
    err = _error(capsys, "show-config", "--set", "data.near.treshold=0.9")
    assert err.startswith("error: --set key 'data.near.treshold' is not a config key; did you mean data.near.threshold")
    assert "tiny.yaml" not in err
    with pytest.raises(ConfigError, match="did you mean pretrain.optim.lr"):
        check_override_keys(["pretrain.optim.lrr"])
    check_override_keys(["grpo.rewards.correct", "data.near.threshold"])  # below a mapping: its validator checks
    keys = config_keys(PipelineConfig)
    assert keys["data.near"] == "section" and keys["grpo.rewards"] == "mapping" and keys["data.near.threshold"] == "value"


def test_a_bad_value_is_blamed_on_where_it_came_from(capsys, tmp_path):
    err = _error(capsys, "show-config", "--set", "data.near.threshold=abc")
    assert "--set data.near.threshold=abc: invalid configuration; key 'data.near.threshold'" in err
    preset = tmp_path / "p.yaml"
    preset.write_text("data:\n  near:\n    threshold: abc\n")
    with pytest.raises(ConfigError, match=f"{preset}: invalid configuration"):
        load_pipeline_config(str(preset), {"pretrain.steps": 3})
    # A value's own check: the --set alone is named.
    with pytest.raises(ConfigError, match=re.escape("--set grpo.rewards={'nope': 1.0}: invalid configuration")):
        load_pipeline_config("tiny", {"grpo.rewards": {"nope": 1.0}})
    # A rule between a section's keys (the preset's guided abstentions need the abstain reward the --set dropped):
    # both are named.
    with pytest.raises(ConfigError, match=re.escape("tiny.yaml with --set grpo.rewards={'arithmetic_exact': 1.0}: "
                                                    "invalid configuration")):
        load_pipeline_config("tiny", {"grpo.rewards": {"arithmetic_exact": 1.0}})


def test_show_config_refuses_a_catalog_that_does_not_exist(capsys, tmp_path):
    err = _error(capsys, "show-config", "--set", f"data.catalog={tmp_path / 'nope'}")
    assert f"data.catalog {tmp_path / 'nope'}: no such folder" in err
    err = _error(capsys, "show-config", "--set", f"data.catalog={tmp_path}")  # a folder, but no sources in it
    assert f"{tmp_path}: no source definitions (*.yaml) found" in err
    assert main(["show-config", "--set", f"data.catalog={ROOT / 'data_catalog'}"]) == 0


def test_a_missing_catalog_is_reported_at_once(tmp_path, isolated_env):
    started = time.monotonic()
    proc = subprocess.run(CLI + ["data", "--catalog", "nope/", "--workdir", str(tmp_path / "work")], cwd=ROOT,
                          env=isolated_env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"--catalog nope/: no such folder ({ROOT / 'nope'})" in proc.stderr
    assert took < 2.0, f"took {took:.1f} s"
    assert not (tmp_path / "prefect-home").exists() and not (tmp_path / "work").exists()  # nothing started


def test_argparse_errors_are_one_line():
    proc = subprocess.run(CLI + ["runs", "--bogus"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unrecognized arguments: --bogus" in proc.stderr


def test_the_default_catalog_from_another_directory_names_the_checkouts(capsys, tmp_path, monkeypatch):
    """The tiny preset's `data_catalog` is relative: from outside the checkout the error says where it is."""
    monkeypatch.chdir(tmp_path)
    err = _error(capsys, "show-config")
    assert f"data.catalog data_catalog: no such folder ({tmp_path / 'data_catalog'})" in err
    assert f"run from the checkout ({ROOT}) or give --set data.catalog={ROOT / 'data_catalog'}" in err
    assert main(["show-config", "--set", f"data.catalog={ROOT / 'data_catalog'}"]) == 0


def test_guidance_errors_say_which_condition_failed(capsys):
    err = _error(capsys, "show-config", "--set", "grpo.abstain_guidance=9")
    assert "grpo.abstain_guidance=9 must be below grpo.group_size=8" in err and "abstain reward" not in err
    err = _error(capsys, "show-config", "--set", "grpo.abstain_guidance=2", "--set", "grpo.rewards={arithmetic_exact: 1.0}")
    assert "needs the abstain reward in grpo.rewards" in err and "group_size" not in err


def test_show_config_refuses_a_model_a_source_or_a_champion_metric_that_does_not_exist(capsys):
    """What `run` would only find out minutes in (the model at pretraining, the metric never promoting a model)."""
    err = _error(capsys, "show-config", "--set", "pretrain.model=nope")
    assert "unknown model preset 'nope'; choose one of" in err and "'demo'" in err
    err = _error(capsys, "show-config", "--set", "data.sources=[nope]")
    assert "unknown source(s) ['nope']" in err
    err = _error(capsys, "show-config", "--set", "registry.metric=nope")
    assert "registry.metric 'nope' must be <stage>/<metric>" in err
    assert main(["show-config", "--set", "registry.metric=pipeline/wall_minutes"]) == 0


@pytest.mark.parametrize("sets, says", [
    (["pretrain.launch.pp=4", "pretrain.launch.num_procs=4", "pretrain.model_overrides.n_layers=2"],
     "pretrain.launch.pp=4 exceeds the model's n_layers=2"),
    (["pretrain.launch.tp=4", "pretrain.launch.num_procs=4"], "pretrain.launch.tp=4 does not divide the model's"),
    (["pretrain.launch.tp=2", "pretrain.launch.num_procs=2", "pretrain.launch.precision=bf16"],
     "pretrain.launch.tp=2 with precision bf16"),
])
def test_layouts_the_model_cannot_take_are_refused_when_the_config_is_read(capsys, sets, says):
    """No server, stage or rank starts: show-config refuses them, in one line (issue 52)."""
    start = time.perf_counter()
    err = _error(capsys, "show-config", *[a for s in sets for a in ("--set", s)])
    assert says in err and time.perf_counter() - start < 3, err


@pytest.mark.parametrize("argv, says", [
    (["show-config", "--preset", "/tmp/" + "b" * 300 + ".yaml"], "file name too long (a name in a path is at most 255"),
    (["show-config", "--set", "data.catalog=/tmp/" + "b" * 300], "file name too long"),
    (["mix", "--target", "a.b=/tmp/t.jsonl"], "a target's NAME has no '.'"),
])
def test_a_path_too_long_and_a_dotted_target_name_are_one_line(capsys, argv, says):
    """A path over 255 bytes is an OSError the CLI says in one line, shortened (issue 52's red-team)."""
    err = _error(capsys, *argv)
    assert says in err and len(err) < 400, err


def test_a_confirm_scale_beyond_its_range_is_refused_by_the_parser():
    out = subprocess.run(CLI + ["mix", "--confirm-scale", "1e30"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "must lie in [1, 1000]" in out.stderr and "Traceback" not in out.stderr
