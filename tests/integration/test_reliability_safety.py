"""Nothing unsafe is loaded or executed, and secrets never reach MLflow.

The code scan walks the AST of every non-test Python file (comments and strings cannot
trigger it, `model.eval()` is not `eval(...)`); an entry in ALLOWED needs a reason.
"""
from __future__ import annotations

import ast

from tests.conftest import ROOT

SCANNED = ["tasks", "models", "infra", "flows", "bench"]
# (relative path, rule) -> why it is safe. Empty: nothing needed an exception so far.
ALLOWED: dict[tuple[str, str], str] = {}


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def unsafe_calls(source: str) -> list[tuple[int, str]]:
    """(line, rule) for every call that can run code from data or a shell."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in ("eval", "exec", "builtins.eval", "builtins.exec"):
            found.append((node.lineno, f"{name}()"))
        elif name in ("pickle.load", "pickle.loads", "marshal.loads", "dill.load", "dill.loads", "cloudpickle.load"):
            found.append((node.lineno, name))
        elif name == "torch.load":
            flag = _kw(node, "weights_only")
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                found.append((node.lineno, "torch.load without weights_only=True"))
        elif name == "yaml.load" and "Safe" not in _dotted(_kw(node, "Loader") or ast.Name("")):
            found.append((node.lineno, "yaml.load without SafeLoader"))
        elif name == "yaml.unsafe_load":
            found.append((node.lineno, name))
        shell = _kw(node, "shell")
        if isinstance(shell, ast.Constant) and shell.value is True:
            found.append((node.lineno, "shell=True"))
        remote = _kw(node, "trust_remote_code")
        if isinstance(remote, ast.Constant) and remote.value is True:
            found.append((node.lineno, "trust_remote_code=True"))
    return found


def test_the_scanner_catches_what_it_claims():
    bad = """
import torch, pickle, yaml, subprocess
torch.load(p)
torch.load(p, weights_only=False)
pickle.loads(b)
eval(s)
exec(s)
yaml.load(s, Loader=yaml.Loader)
subprocess.run(c, shell=True)
AutoModel.from_pretrained(p, trust_remote_code=True)
"""
    good = """
import torch, yaml
torch.load(p, weights_only=True)
model.eval()
yaml.safe_load(s)
yaml.load(s, Loader=yaml.SafeLoader)
x = "eval(s) in a string"  # exec(s) in a comment
"""
    assert [line for line, _ in unsafe_calls(bad)] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert unsafe_calls(good) == []


def test_no_unsafe_loading_or_execution_in_project_code():
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 40  # the scan really looked at the project
    hits = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for line, rule in unsafe_calls(path.read_text(encoding="utf-8")):
            if (rel, rule) not in ALLOWED:
                hits.append(f"{rel}:{line}: {rule}")
    assert not hits, "unsafe calls (fix them, or add to ALLOWED with a reason):\n" + "\n".join(hits)


def test_secrets_never_reach_mlflow_params(tmp_path, monkeypatch):
    import mlflow

    from infra.tracking.runs import stage_run
    from infra.workspace.paths import Workspace

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = {
        "db": {"password": "hunter2", "uri": "postgresql://alice:hunter2@db.example:5432/runs", "port": 5432},
        "hub": {"token": "hf_abcdef123456", "api_key": "sk-live-1", "secret_sauce": "x"},
        "mlflow_uri": "https://bob:pa55@mlflow.example/",
        "plain": "kept",
        # Secret words inside ordinary keys are not secrets: these stay readable.
        "pretrain": {"tokenizer": {"vocab_size": 512}},
        "grpo": {"max_new_tokens": 24},
        "eval": {"max_tokens": 4096},
    }
    ws = Workspace(tmp_path / "ws")
    with stage_run(ws, "secrets", config=config) as run:
        run_id = run.info.run_id
    params = mlflow.tracking.MlflowClient().get_run(run_id).data.params
    dumped = repr(params)
    for secret in ("hunter2", "hf_abcdef123456", "sk-live-1", "pa55", "alice:", "bob:"):
        assert secret not in dumped, f"{secret!r} reached MLflow: {params}"
    assert params["db.password"] == params["hub.token"] == params["hub.api_key"] == "***"
    assert params["db.uri"] == "postgresql://***@db.example:5432/runs"
    assert params["mlflow_uri"] == "https://***@mlflow.example/"
    assert params["plain"] == "kept" and params["db.port"] == "5432"
    assert params["pretrain.tokenizer.vocab_size"] == "512"
    assert params["grpo.max_new_tokens"] == "24" and params["eval.max_tokens"] == "4096"
