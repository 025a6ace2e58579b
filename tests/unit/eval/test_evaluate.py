"""The evaluation stage on tiny real models: token metrics, temperature scaling, answers, checkpoints."""
from __future__ import annotations

import hashlib
import json
import math
import re
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from models.chat_template import encode_prompt, special_ids
from models.export import save_model
from models.llama import Transformer
from models.losses import next_token_loss
from tasks.eval.arithmetic import ArithmeticTask, make_problems
from tasks.eval.config import EvalConfig
from tasks.eval.evaluate import EVAL_FILE, EvalResult, evaluate_checkpoint, evaluate_model
from tasks.reports.eval import (_ROWS, TOKEN_RELIABILITY_PNG, comparison_table, write_comparison,
                                write_reliability_diagrams)
from tasks.tokenizer.tokenize_shards import TokenFile, TokenShards
from tests.conftest import bpe_tokenizer_on, tiny_llama
from tests.helpers.lm_eval_tasks import mc_task_folder

VOCAB = 64
EOS_ID = 2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def markov_tokens(n: int, seed: int, vocab: int = VOCAB, p_rule: float = 0.7) -> np.ndarray:
    """A learnable stream: next = (3 * prev + 1) mod vocab with probability p_rule, else uniform; EOS now and then."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.uint16)
    prev = 7
    for i in range(n):
        if rng.uniform() < 0.02:
            prev = EOS_ID
        elif rng.uniform() < p_rule:
            prev = (3 * prev + 1) % vocab
        else:
            prev = int(rng.integers(6, vocab))
        out[i] = prev
    return out


def trained_tiny_llama(tokens: np.ndarray, steps: int = 80) -> Transformer:
    model = tiny_llama(tie_embeddings=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.from_numpy(tokens.astype(np.int64))
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 33, (16,), generator=gen)
        batch = torch.stack([data[s : s + 33] for s in starts])
        loss = next_token_loss(model(batch[:, :-1]), batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_token_metrics_are_consistent_and_match_the_training_loss() -> None:
    model = tiny_llama()
    tokens = np.random.default_rng(0).integers(0, VOCAB, 500).astype(np.uint16)
    cfg = EvalConfig(max_tokens=300, seq_len=16, batch_size=4, temperature_tokens=200, n_questions=0)
    r = evaluate_model(model, tokens, cfg=cfg)
    assert r.n_tokens == 300 and r.seq_len == 16
    assert r.perplexity == pytest.approx(math.exp(r.val_loss), rel=1e-12)
    # An untrained model is near uniform over the vocabulary.
    assert abs(r.val_loss - math.log(VOCAB)) < 0.1
    for value in r.metrics().values():
        assert math.isfinite(value)
    tc = r.token_calibration
    assert tc.n == 300 and 0 <= tc.ece <= tc.mce <= 1 and 0 <= tc.brier <= 1
    assert tc.accuracy == pytest.approx(r.token_accuracy)
    assert 0.05 <= tc.temperature <= 20 and tc.ece_heldout is not None and tc.ece_after_temperature is not None
    assert sum(r.token_bins.counts) == 300

    # Same windows through the training loss: 18 full windows of 16 plus one of 12.
    with torch.no_grad():
        total, correct = 0.0, 0
        for s in range(0, 300, 16):
            n = min(16, 300 - s)
            w = torch.from_numpy(tokens[s : s + n + 1].astype(np.int64))[None]
            logits = model(w[:, :-1])
            total += float(next_token_loss(logits, w[:, 1:])) * n
            correct += int((logits.argmax(-1) == w[:, 1:]).sum())
    assert r.val_loss == pytest.approx(total / 300, rel=1e-5)
    assert r.token_accuracy == pytest.approx(correct / 300)

    # Batching does not change the numbers.
    r1 = evaluate_model(model, tokens, cfg=cfg.model_copy(update={"batch_size": 1}))
    assert r1.val_loss == pytest.approx(r.val_loss, rel=1e-6)
    assert r1.token_calibration.ece == pytest.approx(tc.ece, abs=1e-9)
    model.train()  # evaluation switches to eval mode and back
    evaluate_model(model, tokens, cfg=cfg)
    assert model.training


def test_temperature_scaling_finds_a_sharpened_model() -> None:
    tokens = markov_tokens(4000, seed=1)
    model = trained_tiny_llama(tokens[:3000], steps=60)
    val = tokens[3000:]
    cfg = EvalConfig(max_tokens=960, seq_len=32, batch_size=8, temperature_tokens=960, n_questions=0, n_bins=10)
    base = evaluate_model(model, val, cfg=cfg)
    assert base.token_accuracy > 0.5  # it learned the rule, so calibration numbers mean something
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # untied head: every logit x4, i.e. temperature 1/4
    sharp = evaluate_model(model, val, cfg=cfg)
    assert sharp.token_accuracy == pytest.approx(base.token_accuracy)
    b, s = base.token_calibration, sharp.token_calibration
    assert s.temperature / b.temperature == pytest.approx(4.0, rel=0.02)
    assert s.ece > b.ece + 0.05
    assert s.ece_after_temperature < s.ece_heldout - 0.05
    # Once each is divided by its fitted temperature, both models make the same predictions.
    assert s.ece_after_temperature == pytest.approx(b.ece_after_temperature, abs=0.01)


def tiny_tokenizer():
    return bpe_tokenizer_on([p.question + " " + p.response for p in make_problems(200, 0)], vocab_size=300)


def test_answer_level_confidence_is_the_probability_of_the_response() -> None:
    tok = tiny_tokenizer()
    vocab = tok.get_vocab_size()
    model = tiny_llama(vocab=vocab, seed=3)
    problems = make_problems(8, seed=5, split="eval")
    tokens = np.random.default_rng(0).integers(0, vocab, 200).astype(np.uint16)
    cfg = EvalConfig(max_tokens=100, seq_len=32, batch_size=4, temperature_tokens=50, max_new_tokens=6)
    task = ArithmeticTask(max_operand=10)  # asked up to 20 (make_problems' default), trained up to 10
    r = evaluate_model(model, tokens, tok, problems, cfg, task=task.model_copy(update={"outer_max_operand": 20}))
    assert len(r.answers) == 8
    assert [a.question for a in r.answers] == [p.question for p in problems]
    assert [a.in_train_range for a in r.answers] == [task.in_range(p.question) for p in problems]
    assert {a.in_train_range for a in r.answers} == {True, False}
    # A random model states no answer: its answer metrics are n/a, never a 0.000 that reads as calibrated.
    assert not any(a.correct for a in r.answers) and r.n_stated == 0
    assert r.answer_calibration is None and r.answer_bins is None and r.answer_selective is None
    metrics = r.metrics()
    assert metrics["answer.n_stated"] == 0 and not any(k.startswith("answer.") and k != "answer.n_stated" for k in metrics)
    # The multiple-choice task needs no parsing: every model has a row there.
    cc = r.choice_calibration
    assert cc is not None and cc.n == 8 and len(r.choices) == 8 and r.choice_selective is not None
    assert cc.accuracy_lo <= cc.accuracy <= cc.accuracy_hi and cc.ece_lo <= cc.ece <= cc.ece_hi
    sp = special_ids(tok)
    for p, a in zip(problems, r.answers):
        assert 1 <= a.n_tokens <= 6 and 0.0 < a.confidence <= a.mean_token_prob <= 1.0
        # Re-score the greedy continuation by teacher forcing: the product of its token probabilities.
        prompt = encode_prompt(tok, p.question)
        with torch.no_grad():
            cont, ids = [], list(prompt)
            for _ in range(a.n_tokens):
                nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
                cont.append(nxt)
                ids.append(nxt)
                if nxt == sp.end_turn:
                    break
            logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0].float(), -1)
            want = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont))
        assert a.confidence == pytest.approx(math.exp(want), rel=1e-4)
        assert a.finished == (cont[-1] == sp.end_turn)
    table = comparison_table({"base": r, "again": r})
    assert "| answer accuracy [95% CI] | n/a (no answer) | n/a (no answer) |" in table
    assert "| questions (stated a number, abstained, prompt) | 8 (0 stated a number, 0 abstained, chat) | 8 (0 stated a number, 0 abstained, chat) |" in table
    assert f"| multiple-choice accuracy | {cc.accuracy:.3f} [{cc.accuracy_lo:.3f}, {cc.accuracy_hi:.3f}] |" in table
    assert table.count("\n") == len(_ROWS) + 2


def test_bits_per_byte_is_the_nats_of_the_text_tokens_over_their_utf8_bytes() -> None:
    tok = tiny_tokenizer()
    vocab = tok.get_vocab_size()
    model = tiny_llama(vocab=vocab, seed=4)
    sp = special_ids(tok)
    docs = [f"{p.question} {p.response} ünïcödé 日本" for p in make_problems(12, seed=2)]
    tokens = np.array([t for d in docs for t in (sp.bos, *tok.encode(d).ids, sp.eos)], dtype=np.uint16)
    cfg = EvalConfig(max_tokens=len(tokens) - 1, seq_len=32, batch_size=3, temperature_tokens=50, n_questions=0)
    r = evaluate_model(model, tokens, tok, cfg=cfg)

    # By hand: the text the predicted tokens decode to (the tokenizer drops BOS/EOS), and the nats
    # of the predictions whose target is not a special token, window by window as evaluated.
    targets = tokens[1:].astype(np.int64)
    assert r.n_bytes == len(tok.decode(targets.tolist()).encode("utf-8"))
    nats = 0.0
    with torch.no_grad():
        for s in range(0, len(targets), 32):
            w = torch.from_numpy(tokens[s : s + 33].astype(np.int64))[None]
            logp = torch.log_softmax(model(w[:, :-1]).double(), dim=-1)[0]
            nats -= sum(float(logp[i, t]) for i, t in enumerate(w[0, 1:].tolist()) if t not in (sp.bos, sp.eos))
    assert r.bpb == pytest.approx(nats / math.log(2) / r.n_bytes, rel=1e-5)
    # Intervals over the windows hold their estimate; without a tokenizer there are no bytes to count.
    assert r.perplexity_lo < r.perplexity < r.perplexity_hi and r.bpb_lo < r.bpb < r.bpb_hi
    metrics = r.metrics()
    assert (metrics["bpb"], metrics["bpb_lo"], metrics["val_ppl_hi"]) == (r.bpb, r.bpb_lo, r.perplexity_hi)
    plain = evaluate_model(model, tokens, cfg=cfg)
    assert plain.bpb is None and "bpb" not in plain.metrics() and plain.val_loss == pytest.approx(r.val_loss)
    one_window = evaluate_model(model, tokens, tok, cfg=cfg.model_copy(update={"max_tokens": 20}))
    assert one_window.bpb is not None and one_window.bpb_lo is None and one_window.perplexity_lo is None


def _write_val_split(out_dir: Path, tokens: np.ndarray, vocab: int) -> None:
    out_dir.mkdir(parents=True)
    (out_dir / "val.bin").write_bytes(tokens.astype("<u2").tobytes())
    (out_dir / "train.bin").write_bytes(b"")
    index = TokenShards(
        dtype="uint16", vocab_size=vocab, eos_id=EOS_ID, val_fraction=0.1, tokenizer_sha256="-", manifest_sha256="-",
        files={
            "val": TokenFile(file="val.bin", tokens=len(tokens), bytes=2 * len(tokens), sha256="-"),
            "train": TokenFile(file="train.bin", tokens=0, bytes=0, sha256="-"),
        },
        sources={},
    )
    (out_dir / "index.json").write_text(index.model_dump_json())


def test_evaluate_checkpoint_writes_json_and_the_report_draws_its_figures(tmp_path: Path, capsys) -> None:
    tok = tiny_tokenizer()
    tok_path = tmp_path / "tokenizer" / "tokenizer.json"
    tok_path.parent.mkdir()
    tok.save(str(tok_path))
    vocab = tok.get_vocab_size()
    model_dir = save_model(tiny_llama(vocab=vocab), tmp_path / "models" / "base")
    tokens = np.random.default_rng(1).integers(0, vocab, 400).astype(np.uint16)
    _write_val_split(tmp_path / "tokens", tokens, vocab)
    cfg = EvalConfig(max_tokens=200, seq_len=32, temperature_tokens=100, n_questions=5, max_new_tokens=4, tasks=[])
    out = tmp_path / "eval" / "base"
    result = evaluate_checkpoint(model_dir, tmp_path / "tokens", tok_path.parent, cfg, out, name="base")
    saved = json.loads((out / EVAL_FILE).read_text())
    assert saved["n_tokens"] == 200 and len(saved["answers"]) == 5
    # It names the model it is about, down to the bytes of its weights.
    weights = hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert saved["model"] == {"stage": "base", "model_dir": str(model_dir), "weights_sha256": weights}
    assert {"correct", "abstained", "confidence", "in_train_range"} <= set(saved["answers"][0])
    tc = result.token_calibration  # the Brier score's interval resamples the same windows as perplexity's
    assert tc.brier_lo < tc.brier < tc.brier_hi
    said = capsys.readouterr().out  # each part of the model's evaluation says when it is done
    for line in ("evaluate base: tokens, answers, choices", "evaluate base: tokens done (", "evaluate base: answers done (",
                 "evaluate base: choices done (", "evaluate base: finished in "):
        assert line in said
    assert saved["bpb_lo"] <= saved["bpb"] <= saved["bpb_hi"] and saved["n_bytes"] > 0  # next to perplexity
    assert EvalResult.model_validate_json((out / EVAL_FILE).read_text()) == result  # eval.json reads back whole
    assert sorted(p.name for p in out.iterdir()) == [EVAL_FILE]  # numbers only: the figures are the report's
    # "base" is in few_shot_models: asked with the completion prompt, not the chat template it never saw.
    assert saved["answer_format"] == "few_shot" and result.answer_format == "few_shot"
    figures = tmp_path / "report" / "base"
    pngs = write_reliability_diagrams(result, "base", figures)
    assert (figures / TOKEN_RELIABILITY_PNG).stat().st_size > 5_000
    assert (figures / "reliability_choices.png").stat().st_size > 5_000
    assert (figures / "reliability_answers.png").is_file() == (result.answer_calibration is not None)
    assert sorted(pngs) == sorted(figures.glob("*.png"))
    # The same model evaluated in memory gives the same numbers as from its checkpoint.
    again = evaluate_model(tiny_llama(vocab=vocab), tokens, cfg=cfg.model_copy(update={"n_questions": 0}))
    assert again.val_loss == pytest.approx(result.val_loss, rel=1e-6)
    md, png = write_comparison({"base": result, "sft": result}, tmp_path / "eval")
    assert "| next-token loss, nats per token (the evaluation's validation windows) |" in md.read_text() and png.stat().st_size > 5_000


def test_bad_inputs_are_refused() -> None:
    model = tiny_llama()
    with pytest.raises(ValueError, match="need at least 2"):
        evaluate_model(model, np.array([1], dtype=np.uint16))
    with pytest.raises(ValueError, match="vocab_size is 64"):
        evaluate_model(model, np.array([1, 2, 99], dtype=np.uint16))
    with pytest.raises(ValueError):
        EvalConfig(temperature_fit_fraction=1.0)
    with pytest.raises(ValueError):
        EvalConfig(unknown_key=1)


def saved_tiny_model(tmp_path: Path) -> tuple[Path, Path]:
    """An untrained tiny model saved with its tokenizer, and validation tokens in tmp_path/tokens."""
    tok = tiny_tokenizer()
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    vocab = tok.get_vocab_size()
    model_dir = save_model(tiny_llama(vocab=vocab), tmp_path / "model")
    _write_val_split(tmp_path / "tokens", np.random.default_rng(1).integers(0, vocab, 400).astype(np.uint16), vocab)
    return model_dir, tok_path


@pytest.mark.parametrize("label", ["sft", "base"])
def test_the_arithmetic_task_through_lm_eval_gives_the_pipelines_answers_item_by_item(tmp_path: Path, label) -> None:
    """eval.tasks' `arithmetic` is the shipped lm-eval task on the model's export: the same prompts (chat template, or
    the few-shot prompt for a base), the same greedy responses and so the same accuracy as the pipeline's (issue 50)."""
    torch.manual_seed(3)
    model_dir, tok_path = saved_tiny_model(tmp_path)
    cfg = EvalConfig(max_tokens=200, seq_len=32, temperature_tokens=100, n_questions=24, max_new_tokens=6,
                     multiple_choice=False, tasks=["arithmetic"])
    result = evaluate_checkpoint(model_dir, tmp_path / "tokens", tok_path, cfg, tmp_path / "eval", name=label)
    harness = result.tasks["arithmetic"]
    assert harness.lm_eval_task == ("llmforge_arithmetic_few_shot" if label == "base" else "llmforge_arithmetic")
    # Greedy, token for token: lm-eval's text is the pipeline's without the special tokens an untrained model emits.
    assert [i.response for i in harness.items] == [re.sub(r"<\|[a-z_]+\|>", "", a.response) for a in result.answers]
    assert [i.correct for i in harness.items] == [a.correct for a in result.answers]
    assert harness.metrics["accuracy"] == pytest.approx(sum(a.correct for a in result.answers) / 24)
    assert "accuracy" in harness.stderr and harness.n == 24 and harness.calibration is not None
    assert result.metrics()["arithmetic.accuracy"] == harness.metrics["accuracy"]
    assert "arithmetic.calibration.ece_equal_mass" in result.metrics()



def test_items_the_decontamination_found_are_scored_apart(tmp_path: Path) -> None:
    """Where the training data held some of a task's items, the task's accuracy comes apart on the clean and the
    contaminated items (GPT-3's clean/dirty split), each with its interval (issue 50)."""
    from tasks.eval.items import arithmetic_item

    model_dir, tok_path = saved_tiny_model(tmp_path)
    cfg = EvalConfig(max_tokens=200, seq_len=32, temperature_tokens=100, n_questions=12, max_new_tokens=4,
                     multiple_choice=False, tasks=["arithmetic"])
    questions = ArithmeticTask().questions(12, 0)
    found = tmp_path / "found.jsonl"
    found.write_text("".join(json.dumps({"task": "arithmetic", "text": arithmetic_item(p.question, p.answer)}) + "\n"
                             for p in questions[:5]) + json.dumps({"task": "other", "text": "x"}) + "\n")
    result = evaluate_checkpoint(model_dir, tmp_path / "tokens", tok_path, cfg, tmp_path / "eval", name="sft",
                                 contaminated=found)
    scores = result.tasks["arithmetic"]
    assert [i.contaminated for i in scores.items] == [True] * 5 + [False] * 7
    assert (scores.contaminated.n, scores.clean.n) == (5, 7)
    assert result.metrics()["arithmetic.contaminated.n"] == 5.0


def test_a_multiple_choice_task_of_the_users_folder_gets_its_accuracy_and_calibration(tmp_path: Path, monkeypatch) -> None:
    """A YAML task of eval.task_paths, read offline: lm-eval's acc with its standard error, and each item's confidence
    (the chosen option's probability over the options) for ECE, Brier and AURC (issue 50). In a process whose
    environment names a DeepSpeed launch's rendezvous on a port in use, as a flow's after a launch: lm-eval joins no
    process group."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(busy.getsockname()[1])}.items():
        monkeypatch.setenv(key, value)
    rows = [{"question": f"colour number {i}?", "choices": ["red", "green", "blue"], "label": i % 3} for i in range(30)]
    folder = mc_task_folder(tmp_path / "tasks", "colours", rows, "Q: {{question}}\\nA:")
    model_dir, tok_path = saved_tiny_model(tmp_path)
    cfg = EvalConfig(max_tokens=200, seq_len=32, temperature_tokens=100, n_questions=0, tasks=["colours"],
                     task_paths=[folder])
    scores = evaluate_checkpoint(model_dir, tmp_path / "tokens", tok_path, cfg, tmp_path / "eval", name="sft").tasks["colours"]
    assert scores.output_type == "multiple_choice" and scores.n == 30 and "acc" in scores.stderr
    assert scores.metrics["acc"] == pytest.approx(sum(i.correct for i in scores.items) / 30)  # lm-eval's argmax
    assert all(1 / 3 - 1e-9 <= i.confidence <= 1 for i in scores.items)
    c = scores.calibration
    assert c.ece_equal_mass_lo <= c.ece_equal_mass <= c.ece_equal_mass_hi and scores.selective.aurc is not None
