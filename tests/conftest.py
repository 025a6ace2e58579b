"""Shared fixtures: an isolated environment for subprocesses that run real Prefect and MLflow."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.training.config import LOOP_KEYS

# The shared helpers' asserts report their values as the test modules' do (before any of them is imported).
pytest.register_assert_rewrite("tests.helpers")

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (a stable sort): with `-n 2` a long end-to-end test started last would
    leave one worker idle for minutes."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _tracking_uri_stays_put() -> Iterator[None]:
    """Fail a test that leaves MLFLOW_TRACKING_URI changed (mlflow.set_tracking_uri exports it):
    every later test in the process would log to that test's store."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    after = os.environ.get("MLFLOW_TRACKING_URI")
    if after != before:
        os.environ.pop("MLFLOW_TRACKING_URI", None) if before is None else os.environ.update(MLFLOW_TRACKING_URI=before)
        pytest.fail(f"the test left MLFLOW_TRACKING_URI={after!r} (was {before!r}); use MlflowClient(uri) instead")


@pytest.fixture
def isolated_env(tmp_path) -> dict[str, str]:
    """Env for a CLI subprocess: its own Prefect home (ephemeral API on SQLite) and MLflow store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="INFO",
        DS_ACCELERATOR="cpu",
        PYTHONUNBUFFERED="1",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
        LLMFORGE_HOME=str(tmp_path / "work"),
    )
    return env


def start_prefect_server(home: Path):
    """A real Prefect server (SQLite under `home`) in its own session; (process, API URL) once it answers."""
    import socket
    import subprocess
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home}/prefect.db")
    with (home / "server.log").open("w") as log:
        server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{api}/health", timeout=2).json() is True:
                return server, api
        except (httpx.HTTPError, ValueError):
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"the test Prefect server did not start; see {home / 'server.log'}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory) -> Iterator[str]:
    """One real Prefect server (SQLite) for the session's CLI tests: each CLI run would otherwise
    start and migrate its own temporary server, ~10 s apiece on this machine."""
    server, api = start_prefect_server(tmp_path_factory.mktemp("prefect-server"))
    try:
        yield api
    finally:
        stop_process(server, timeout=20)


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def prefect_env(isolated_env, prefect_api) -> dict[str, str]:
    """isolated_env pointed at the session's Prefect server (its own workspace and MLflow store still)."""
    return {**isolated_env, "PREFECT_API_URL": prefect_api}


def words(rng: random.Random, n: int) -> str:
    vocab = [f"w{i}" for i in range(400)]
    return " ".join(rng.choice(vocab) for _ in range(n))


_STOP = ["the", "and", "to", "of", "that", "with", "have", "be", "in", "for"]
_WORDS = (
    "river market garden window letter village station harvest winter summer teacher doctor "
    "engine paper music story bridge forest castle kitchen island mountain ocean valley "
    "careful bright quiet ancient modern simple narrow gentle heavy rapid silver golden "
    "builds carries describes follows gathers measures opens reaches repairs studies "
    "travels visits watches writes answers borrows collects counts covers crosses"
).split()


def prose(rng: random.Random, sentences: int = 12) -> str:
    """Varied English-like prose that passes the standard Gopher/C4/FineWeb rules."""
    out = []
    for _ in range(sentences):
        n = rng.randint(8, 16)
        ws = [rng.choice(_STOP) if rng.random() < 0.3 else rng.choice(_WORDS) for _ in range(n)]
        out.append(" ".join(ws).capitalize() + ".")
    return " ".join(out)


CLI = [sys.executable, "-m", "flows.cli"]


# --- eval/report fixtures ---
# Shared by the evaluation, calibration and training tests; torch and tokenizers are
# imported inside so that tests which need neither do not pay for them at collection.


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest single-threaded; on a busy 2-core box two threads spin-wait (50x slower).

    Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama(vocab: int = 64, seed: int = 0, **overrides):
    """A 2-layer Llama of width 32, seeded; `overrides` change the shape (e.g. max_seq_len=16)."""
    import torch

    from models.llama import Transformer, model_config

    torch.manual_seed(seed)
    shape = dict(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=64)
    return Transformer(model_config("demo", vocab_size=vocab, **{**shape, **overrides}))


def bpe_tokenizer_on(texts: list[str], vocab_size: int):
    """A small byte-level BPE trained on `texts`, with the project's special tokens at ids 0..5."""
    from tasks.tokenizer.train import train_bpe

    return train_bpe(texts, vocab_size)


def run_cli(args: list[str], env: dict[str, str], timeout: float = 600):
    """Run `python -m flows.cli ARGS` from the repository root; fail the test with the output's tail unless it exits 0."""
    import subprocess

    proc = subprocess.run(CLI + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


# --- training fixtures ---


def small_alphabet_bpe(vocab_size: int = 64):
    """A byte-level BPE over only the characters of an arithmetic prompt (unlike bpe_tokenizer_on, no
    256-byte base alphabet), so its vocabulary can be as small as ~48 tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from models.special_tokens import SPECIAL_TOKENS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    tok.train_from_iterator(["What is 3 + 4? <answer>7</answer> abc xyz 0123456789 - ="] * 20, trainer)
    return tok


def write_word_tokenizer(path: Path, vocab_size: int) -> Path:
    """A word-level tokenizer.json: the special tokens, then w<i> for every other id."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from models.special_tokens import SPECIAL_TOKENS

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def write_token_shards(out_dir: Path, vocab_size: int) -> Path:
    """train.bin / val.bin of short patterned documents and their index.json, as tokenize_shards writes them."""
    import hashlib

    import numpy as np

    from tasks.tokenizer.tokenize_shards import INDEX_FILE, SourceCount, TokenFile, TokenShards

    out_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    files, sources = {}, {}
    for split, n in (("train", 6000), ("val", 600)):
        docs = [np.append(10 + (np.arange(int(rng.integers(10, 40))) % 7) * 3, 2) for _ in range(n // 20)]
        tokens = np.concatenate(docs).astype("<u2")
        path = out_dir / f"{split}.bin"
        tokens.tofile(path)
        files[split] = TokenFile(file=path.name, tokens=len(tokens), bytes=path.stat().st_size,
                                 sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        sources[split] = {"test": SourceCount(documents=len(docs), tokens=len(tokens))}
    index = TokenShards(dtype="uint16", vocab_size=vocab_size, eos_id=2, val_fraction=0.1, tokenizer_sha256="t",
                        manifest_sha256="m", files=files, sources=sources)
    (out_dir / INDEX_FILE).write_text(index.model_dump_json())
    return out_dir


def tiny_pretrain_config(**overrides):
    """A PretrainConfig of a 2-layer, 32-wide model on 16-token windows, with `overrides`."""
    from tasks.training.config import PretrainConfig

    base = dict(
        model="demo",
        model_overrides=dict(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=16),
        seq_len=16, micro_batch_size=4, max_steps=6, precision="fp32",
    )
    return PretrainConfig(**nested({**base, **overrides}))


TINY_VOCAB = 64
TINY_SEQ = 16


def loop_model(seed: int = 0):
    """tiny_llama over TINY_VOCAB tokens and TINY_SEQ positions: what the training-loop tests train."""
    return tiny_llama(TINY_VOCAB, seed, max_seq_len=TINY_SEQ)


def random_tokens(n: int = 8_000):
    """Uniform random token ids (6..TINY_VOCAB-1), seeded."""
    import numpy as np

    return np.random.default_rng(1).integers(6, TINY_VOCAB, n).astype(np.uint16)


def launch_into(stage, out_dir: Path, ws_root: Path, log=lambda line: None, **inputs):
    """Launch a training stage object into `out_dir` (no cache key; a rerun resumes its checkpoints); its result."""
    from infra.stages import in_run
    from infra.workspace.paths import Workspace

    return in_run(stage, Workspace.locate(ws_root), Path(out_dir), log=log, **inputs)


def nested(flat: dict) -> dict:
    """A training config from flat keys (`lr=...`, as the loop's configs once were) as composed ones
    (`{"optim": {"lr": ...}}`): the tests' shorthand."""
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = LOOP_KEYS.get(key, key).split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def train_config(**flat):
    """A PretrainConfig from flat keys of the loop (lr=, zero=, max_steps=, ...), with no other defaults."""
    from tasks.training.config import PretrainConfig

    return PretrainConfig(**nested(flat))


def sft_config(**flat):
    """An SftConfig from flat keys (lr=, seq_len=, ckpt_every=, ...)."""
    from tasks.training.config import SftConfig

    return SftConfig(**nested(flat))


def grpo_config(**flat):
    """A GrpoConfig from flat keys (lr=, ckpt_every=, num_procs=, ...)."""
    from tasks.training.config import GrpoConfig

    return GrpoConfig(**nested(flat))


def train_config_for(**overrides):
    """A fast fp32 ZeRO-0 training config for TINY_SEQ windows, with `overrides` (flat keys: lr=, zero=, ...)."""
    from tasks.training.config import PretrainConfig

    base = dict(seq_len=TINY_SEQ, micro_batch_size=4, grad_accum=1, lr=3e-3, warmup_steps=2, max_steps=8,
                log_every=1, precision="fp32", zero="zero0", peak_flops=1e11, eval_batches=2, seed=0)
    return PretrainConfig(**nested({**base, **overrides}))


@pytest.fixture
def pretrain_inputs(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(tokenizer.json, token shards folder) of a 120-token vocabulary in tmp_path, and no outside MLflow store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return write_word_tokenizer(tmp_path / "tokenizer.json", 120), write_token_shards(tmp_path / "tokens", 120)


def saved_tokenizer(tok, tmp_path: Path) -> Path:
    """`tok` saved as tmp_path/tokenizer.json."""
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def eval_result_with_answers(questions: list[str], correct, confidences, answer_format: str = "chat",
                             target_accuracy: float = 0.8, in_range=None):
    """An EvalResult whose answers are `questions` with these correct flags and confidences (token level: the same);
    `in_range`: which questions lie in the training range (None: no range set)."""
    import math

    from tasks.eval.config import EvalConfig
    from tasks.eval.evaluate import AnswerRecord, EvalResult
    from tasks.eval.scored import scored_answers
    from tasks.eval.intervals import proportion

    cfg = EvalConfig(n_bins=10, bootstrap_resamples=200, target_accuracy=target_accuracy)
    calibration, bins, selective = scored_answers(confidences, correct, cfg)
    flags = [None] * len(questions) if in_range is None else [bool(f) for f in in_range]
    answers = [AnswerRecord(question=q, expected=1, response="<answer>1</answer>", correct=bool(c), confidence=float(p),
                            mean_token_prob=float(p), n_tokens=4, finished=True, parsed=1, in_train_range=f)
               for q, c, p, f in zip(questions, correct, confidences, flags)]
    inside = [a.correct for a in answers if a.in_train_range]
    from tasks.eval.abstention import abstention_report

    return EvalResult(n_tokens=10, seq_len=8, val_loss=1.0, perplexity=math.e, token_accuracy=0.5,
                      token_calibration=calibration, token_bins=bins, answer_format=answer_format, answers=answers,
                      answer_calibration=calibration, answer_bins=bins, answer_selective=selective,
                      answer_in_range=proportion(inside) if inside else None,
                      answer_abstention=abstention_report([a.correct for a in answers], [False] * len(answers)))


# --- the order tests run in ---


def pytest_configure(config: pytest.Config) -> None:
    """Register tests/helpers/schedule.py's LongestFirst: it has the last word on the order (longest first, by a table
    of measured seconds), after pytest_collection_modifyitems above has put the slow tests first."""
    from tests.helpers.schedule import LongestFirst

    config.pluginmanager.register(LongestFirst(), "llmforge-longest-first")
