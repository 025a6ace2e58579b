"""The registered model loads with standard tools alone: MLflow's pyfunc answers a plain
question, `@champion` moves only to a better model and the same weights are registered once, and transformers generates from the
downloaded artifact with our chat template and stops at <|end|>; all in a process that
cannot import the project's own packages."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from infra.tracking.runs import stage_run
from infra.workspace.paths import Workspace
from models.chat_template import encode_chat, encode_prompt, special_ids
from models.export import export_hf_llama
from models.losses import next_token_loss
from models.sampling import generate
from models.special_tokens import END_TURN, SPECIAL_TOKENS
from tasks.reports.register import CHAMPION, INPUT_EXAMPLE, lineage_tags, register_final_model
from tests.conftest import saved_tokenizer, small_alphabet_bpe, tiny_llama

pytestmark = pytest.mark.slow

NAME = "llmforge-test"
ANSWER = "<answer>7</answer>"

# Runs in a fresh interpreter with cwd=tmp_path. The finder goes first on sys.meta_path, so
# even an installed (editable) llmforge cannot be imported: only MLflow and transformers load it.
LOADER = r'''
import sys

PROJECT = {"tasks", "models", "infra", "flows"}


class NoProjectPackages:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in PROJECT:
            raise ImportError(f"{name}: the registered model must load without the llmforge packages")
        return None


sys.meta_path.insert(0, NoProjectPackages())

import json

import mlflow
import transformers

name, question, dst = sys.argv[1:4]
answers = mlflow.pyfunc.load_model(f"models:/{name}@champion").predict([question])

local = mlflow.artifacts.download_artifacts(f"models:/{name}@champion", dst_path=dst)
model = transformers.AutoModelForCausalLM.from_pretrained(f"{local}/model")
tokenizer = transformers.AutoTokenizer.from_pretrained(f"{local}/components/tokenizer")
prompt = tokenizer.apply_chat_template(
    [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
)
out = model.generate(**prompt, max_new_tokens=30, do_sample=False)
new = out[0, prompt["input_ids"].shape[1]:].tolist()
print(json.dumps({
    "answers": list(answers),
    "champion_model_id": mlflow.models.get_model_info(f"models:/{name}@champion").model_id,
    "prompt_ids": prompt["input_ids"][0].tolist(),
    "new_ids": new,
    "text": tokenizer.decode(new, skip_special_tokens=True),
    "project_modules": sorted(m for m in sys.modules if m.partition(".")[0] in PROJECT),
}))
'''


def overfit(model, tok, steps: int = 200):
    """Teach the tiny model one exchange, so that it answers and then says <|end|>."""
    enc = encode_chat(tok, [{"role": "user", "content": INPUT_EXAMPLE}, {"role": "assistant", "content": ANSWER}])
    inp, tgt = torch.tensor([enc.ids[:-1]]), torch.tensor([[t if m else -100 for t, m in zip(enc.ids[1:], enc.loss_mask[1:])]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        next_token_loss(model(inp), tgt).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A tiny model that answers INPUT_EXAMPLE and an untrained one, registered into a SQLite store of its own."""
    tmp_path = tmp_path_factory.mktemp("registry")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # see conftest.one_torch_thread
        try:
            yield tmp_path, *_register(tmp_path)
        finally:
            torch.set_num_threads(threads)


def _register(tmp_path):
    tok = small_alphabet_bpe(64)
    model = overfit(tiny_llama(vocab=tok.get_vocab_size()), tok)
    end = special_ids(tok).end_turn
    prompt = encode_prompt(tok, INPUT_EXAMPLE)
    ours = generate(model, torch.tensor([prompt]), 20, temperature=0.0, eos_id=end).tokens[0, len(prompt):].tolist()
    expected = encode_chat(tok, [{"role": "user", "content": INPUT_EXAMPLE}, {"role": "assistant", "content": ANSWER}]).ids
    assert ours[: ours.index(end) + 1] == expected[len(prompt):], "the tiny model did not learn its one answer"

    tokenizer_json = saved_tokenizer(tok, tmp_path)
    hf_dir = export_hf_llama(model, tmp_path / "hf", tokenizer_json=tokenizer_json)
    untrained = export_hf_llama(tiny_llama(vocab=tok.get_vocab_size(), seed=1), tmp_path / "hf_untrained",
                                tokenizer_json=tokenizer_json)
    ws = Workspace(tmp_path / "work")
    with stage_run(ws, "pipeline") as run:
        lineage = lineage_tags(tokenizer_json, tokenizer_json, "abc", {"grpo": "r1"})
        metric = "evaluate/grpo.answer.accuracy"
        versions = [
            register_final_model(untrained, NAME, lineage, metric=(metric, 0.4)),  # 1: the first is champion
            register_final_model(hf_dir, NAME, lineage, metric=(metric, 0.6)),  # 2: better, takes @champion
            register_final_model(hf_dir, NAME, lineage, metric=(metric, 0.6)),  # same weights: nothing new
            register_final_model(untrained.rename(tmp_path / "hf_copy"), NAME, lineage, metric=(metric, 0.5)),
        ]
    return ws, run, versions, lineage, prompt


def test_same_weights_register_nothing_and_champion_moves_on_merit(registered):
    from mlflow.tracking import MlflowClient

    _, ws, run, versions, lineage, _ = registered
    assert versions == ["1", "2", "2", "1"]  # the untrained weights again (moved folder): version 1, not a third
    client = MlflowClient()
    assert len(client.search_model_versions(f"name='{NAME}'")) == 2
    for v in ("1", "2"):
        version = client.get_model_version(NAME, v)
        assert version.run_id == run.info.run_id
        assert {k: version.tags[k] for k in lineage} == lineage
        assert version.tags["pipeline_run_id"] == run.info.run_id and version.tags["grpo_run_id"] == "r1"
        assert len(version.tags["weights_sha256"]) == 64
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "2"
    second = client.get_model_version(NAME, "2")
    assert "champion: evaluate/grpo.answer.accuracy = 0.6 > 0.4 of version 1" in second.description
    assert "champion: the first version" in client.get_model_version(NAME, "1").description
    assert client.get_registered_model(NAME).description
    with stage_run(ws, "pipeline"), pytest.raises(ValueError, match="export_hf"):
        register_final_model(None, NAME, lineage)  # GRPO ran with export_hf=false


def test_a_worse_model_is_registered_but_not_champion(tmp_path, registered):
    from mlflow.tracking import MlflowClient

    fixture_tmp, ws, _, _, lineage, _ = registered
    tokenizer_json = fixture_tmp / "tokenizer.json"
    worse = export_hf_llama(tiny_llama(vocab=64, seed=2), tmp_path / "hf_worse", tokenizer_json=tokenizer_json)
    with stage_run(ws, "pipeline"):
        version = register_final_model(worse, NAME, lineage, metric=("evaluate/grpo.answer.accuracy", 0.5))
    client = MlflowClient()
    assert version == "3" and str(client.get_model_version_by_alias(NAME, CHAMPION).version) == "2"
    assert "not champion: evaluate/grpo.answer.accuracy = 0.5, not > 0.6 of version 2" in \
        client.get_model_version(NAME, "3").description


def test_registered_model_loads_without_the_project(registered):
    import mlflow
    from mlflow.tracking import MlflowClient

    tmp_path, ws, _, _, _, prompt = registered
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHONPATH"))}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{ws.mlflow_db}", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", LOADER, NAME, INPUT_EXAMPLE, str(tmp_path / "download")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])

    assert got["project_modules"] == []
    assert got["answers"] == [ANSWER]  # a plain question in, the answer text out
    champion = MlflowClient().get_model_version_by_alias(NAME, CHAMPION)
    assert got["champion_model_id"] == mlflow.models.get_model_info(champion.source).model_id
    assert got["prompt_ids"] == prompt  # transformers' chat template = our encode_prompt
    end = SPECIAL_TOKENS.index(END_TURN)
    assert got["new_ids"][-1] == end and end not in got["new_ids"][:-1] and len(got["new_ids"]) < 30
    assert got["text"] == ANSWER
