"""Reference launches shared by several tests: each runs once per test run (tests/helpers/shared.py), whichever test
asks first, and the others read its outputs back from disk.

- `sft_reference`: one SFT through the launcher (catalog with two rejects, replay, HF export, a checkpoint
  every 5 steps). test_sft_stage checks the run; the SFT kill test compares its killed-and-resumed run with it.
- `grpo_reference`: a quick SFT model, then one GRPO of 6 steps with a checkpoint every 2. test_grpo_stage
  checks the run; the GRPO kill test compares its killed-and-resumed run with it.
- `zero2_two_rank`: a 2-rank ZeRO-2 pretraining, launched with a private TMPDIR and /dev/shm counted before
  and after. test_deepspeed_launch checks the run, test_multinode compares the two-node run with it, and
  test_reliability_signals checks that it left nothing behind.

Each is a `Reference`: the stage's config and inputs (files in the shared folder), its out folder and
workspace, and the result re-read from its result.json. Consumers must not write into the shared folder:
a kill test launches the same config and inputs into its own tmp_path.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tasks.eval.arithmetic import ArithmeticTask
from tests.conftest import (ROOT, grpo_config, launch_into, saved_tokenizer, sft_config, small_alphabet_bpe, tiny_llama,
                            tiny_pretrain_config, write_token_shards, write_word_tokenizer)
from tests.helpers.shared import shared_once

LINES_FILE = "lines.txt"  # what the launch streamed back, one line each
CHECKS_FILE = "checks.json"  # zero2_two_rank: what the launch left behind


@dataclass(frozen=True)
class Reference:
    root: Path  # the shared folder (read-only for consumers)
    cfg: Any  # the stage's config
    inputs: dict[str, Path | None]  # the stage's inputs, files under root
    out: Path  # the stage's out folder
    ws: Path  # its workspace (MLflow store)
    result: Any  # its Result, re-read from out/result.json

    @property
    def lines(self) -> list[str]:
        return (self.root / LINES_FILE).read_text(encoding="utf-8").splitlines()


@contextlib.contextmanager
def _launch_env() -> Iterator[None]:
    """While a reference is built: no MLflow store of the caller's, and ranks that import this checkout."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        mp.setenv("DS_ACCELERATOR", "cpu")
        yield


def _launch(stage: Any, root: Path, name: str, **inputs: Path | None) -> Any:
    lines: list[str] = []
    try:
        with _launch_env():
            return launch_into(stage, root / name, root / "ws", lines.append, **inputs)
    finally:
        (root / LINES_FILE).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _reference(stage_cls: Any, root: Path, cfg: Any, name: str, inputs: dict[str, Path | None]) -> Reference:
    from infra.stages import read_result

    return Reference(root=root, cfg=cfg, inputs=inputs, out=root / name, ws=root / "ws",
                     result=read_result(stage_cls(cfg), root / name))


# ----------------------------------------------------------------------------- SFT


SFT_VOCAB = 64


def sft_reference_config(catalog: Path):
    """test_sft_stage's run (30 steps, 2 of each micro-batch's 8 rows replayed), with a checkpoint every 5 steps
    for the kill test to resume from."""
    from tasks.training.config import SftDataConfig

    return sft_config(seq_len=48, micro_batch_size=8, max_steps=30, lr=3e-3, warmup_steps=2, log_every=10,
                      eval_batches=2, peak_flops=1e9, torch_threads=1, replay_fraction=0.25, ckpt_every=5,
                      data=SftDataConfig(catalog=catalog, val_fraction=0.2))


def _sft_inputs(root: Path) -> dict[str, Any]:
    return {"base": root / "base", "tokenizer": root / "tokenizer.json", "tokens": root / "tokens",
            "task": ArithmeticTask()}


def _build_sft(root: Path) -> None:
    from models.export import save_model
    from tasks.eval.arithmetic import make_problems
    from tasks.training.sft.stage import Sft

    tok = small_alphabet_bpe(SFT_VOCAB)
    saved_tokenizer(tok, root)
    save_model(tiny_llama(tok.get_vocab_size()), root / "base")
    # A catalog with good records, a malformed line and one record too long for seq_len.
    catalog = root / "sft_catalog"
    catalog.mkdir()
    rows = [{"instruction": p.question, "response": p.response} for p in make_problems(40, 1, 9, "+", split="sft")]
    lines = [json.dumps(r) for r in rows] + ["{not json", json.dumps({"instruction": "abc " * 30, "response": "x"})]
    (catalog / "arith.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (catalog / "arith.yaml").write_text("name: arith_jsonl\nkind: sft_jsonl\npath: arith.jsonl\nlicence: CC0-1.0\n",
                                        encoding="utf-8")
    write_token_shards(root / "tokens", tok.get_vocab_size())  # what the replayed rows are drawn from
    _launch(Sft(sft_reference_config(catalog)), root, "sft", **_sft_inputs(root))


@pytest.fixture(scope="session")
def sft_reference(tmp_path_factory) -> Reference:
    from tasks.training.sft.stage import Sft

    root = shared_once(tmp_path_factory, "sft-reference", _build_sft)
    return _reference(Sft, root, sft_reference_config(root / "sft_catalog"), "sft", _sft_inputs(root))


# ----------------------------------------------------------------------------- GRPO


def quick_sft(model: Any, tok: Any, steps: int = 60) -> Any:
    """A few plain-torch SFT steps so the model answers in the <answer> format (rewards then vary)."""
    import torch

    from tasks.eval.arithmetic import make_problems
    from tasks.training.sft.data import SftExample
    from tasks.training.sft.stage import chat_batches, encode_examples, sft_loss

    examples = [SftExample(source="a", messages=p.messages()) for p in make_problems(50, 0, 9, "+", split="sft")]
    encs, _, _ = encode_examples(tok, examples, seq_len=64)
    batches = chat_batches(encs, batch_size=16, pad_id=0, seq_len=64, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for i in range(steps):
        loss = sft_loss(model, batches(i, 0, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def grpo_reference_config():
    """6 steps of 2 prompts x 4 completions, samples kept every step, a checkpoint every 2 steps."""
    return grpo_config(group_size=4, prompts_per_step=2, max_new_tokens=12, steps=6, lr=1e-3, eval_prompts=6,
                       n_train_problems=10, samples_every=1, ckpt_every=2, torch_threads=1)


def _grpo_inputs(root: Path) -> dict[str, Any]:
    """The quick SFT model, its tokenizer, and sums of operands up to 9 (what the quick SFT taught)."""
    return {"sft": root / "sft", "tokenizer": root / "tokenizer.json", "task": ArithmeticTask(ops="+", max_operand=9)}


def _build_grpo(root: Path) -> None:
    import torch

    from models.export import save_model
    from tasks.training.grpo.stage import Grpo

    tok = small_alphabet_bpe(64)
    saved_tokenizer(tok, root)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, two spin-wait on a busy 2-core box
    try:
        save_model(quick_sft(tiny_llama(tok.get_vocab_size()), tok), root / "sft")
    finally:
        torch.set_num_threads(threads)
    _launch(Grpo(grpo_reference_config()), root, "grpo", **_grpo_inputs(root))


@pytest.fixture(scope="session")
def grpo_reference(tmp_path_factory) -> Reference:
    from tasks.training.grpo.stage import Grpo

    root = shared_once(tmp_path_factory, "grpo-reference", _build_grpo)
    return _reference(Grpo, root, grpo_reference_config(), "grpo", _grpo_inputs(root))


# ----------------------------------------------------------------------------- 2-rank ZeRO-2 pretraining


ZERO2_VOCAB = 120
ZERO2_SETTINGS = dict(warmup_steps=1, lr=3e-3, ckpt_every=3, log_every=1, eval_batches=2, zero="zero2",
                      peak_flops=1e11)  # test_multinode's two-node run uses these too


def zero2_config(**launch: Any):
    """6 steps of the tiny model, ZeRO-2, with `launch` settings (2 ranks on this machine unless told)."""
    return tiny_pretrain_config(**ZERO2_SETTINGS, **{"num_procs": 2, **launch})


def _zero2_inputs(root: Path) -> dict[str, Path | None]:
    return {"tokens": root / "tokens", "tokenizer": root / "tokenizer.json"}


def _build_zero2(root: Path) -> None:
    from infra.launch.launcher import shm_buffers
    from tasks.training.pretrain.stage import Pretrain
    from tests.helpers.processes import new_shm_files, shm_files

    write_word_tokenizer(root / "tokenizer.json", ZERO2_VOCAB)
    write_token_shards(root / "tokens", ZERO2_VOCAB)
    # A private temp folder for the launch's processes (this one keeps its own): what is left in it outlived
    # the launch. /dev/shm before and after: a leak is a file that stays.
    private_tmp = root / "tmp"
    private_tmp.mkdir()
    tempfile.gettempdir()
    before = shm_files()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TMPDIR", str(private_tmp))
            # torch's per-user compile cache (torchinductor_<user>, made empty when a rank imports the inductor)
            # lives in the temp folder by default: a cache every run shares, not something a run leaves.
            mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor-cache"))
            _launch(Pretrain(zero2_config()), root, "pretrain", **_zero2_inputs(root))
    finally:
        new = new_shm_files(before)
    launched = next(line for line in (root / LINES_FILE).read_text().splitlines() if line.startswith("launching: "))
    port = int(re.search(r"--master_port (\d+)", launched).group(1))
    checks = {"new_shm_files": sorted(new), "master_port": port,
              "shm_buffers_of_the_port": [str(p) for p in shm_buffers(port)],
              "left_in_tmpdir": sorted(os.listdir(private_tmp))}
    (root / CHECKS_FILE).write_text(json.dumps(checks, indent=1), encoding="utf-8")


@pytest.fixture(scope="session")
def zero2_two_rank(tmp_path_factory) -> Reference:
    from tasks.training.pretrain.stage import Pretrain

    root = shared_once(tmp_path_factory, "zero2-two-rank", _build_zero2)
    return _reference(Pretrain, root, zero2_config(), "pretrain", _zero2_inputs(root))


def leak_checks(ref: Reference) -> dict[str, Any]:
    """What zero2_two_rank's launch left behind (CHECKS_FILE)."""
    return json.loads((ref.root / CHECKS_FILE).read_text(encoding="utf-8"))
