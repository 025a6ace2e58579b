"""The one place that knows where artifacts live.

Everything a run writes sits under one workspace folder (default `./work`, or
`$LLMFORGE_HOME`), so a run is easy to inspect, copy or delete.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def locate(cls, root: str | Path | None = None) -> "Workspace":
        """The workspace at `root`; without one, at `$LLMFORGE_HOME`, else `./work`."""
        chosen = root or os.environ.get("LLMFORGE_HOME") or "work"
        return cls(Path(chosen).resolve())

    def ensure_writable(self) -> "Workspace":
        """Create the workspace, failing early with a clear message if it cannot be written."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / ".write-probe"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise PermissionError(
                f"workspace {self.root} is not writable ({exc.strerror}); "
                "choose another folder with --workdir or LLMFORGE_HOME"
            ) from exc
        return self

    # Stage outputs: work/<store>/<key>/, one folder per key of (inputs' content, config, code),
    # never overwritten by another key; `latest` links to the newest one for people to read.
    STORES = (
        "data/collect", "data/merge", "data/decont", "data/holdout", "data/exact", "data/near", "data/quality", "data/pii", "data/mix",
        "data/shards", "tokenizer", "tokens", "checkpoints/pretrain", "checkpoints/sft", "checkpoints/grpo",
        "eval", "eval/targets", "eval/items", "scale", "ablate", "mix",
    )
    KEY_CHARS = 16  # of the sha256: enough to never collide among a workspace's outputs

    def store(self, name: str) -> Path:
        """The folder that holds every output of one stage, e.g. store("data/near")."""
        if name not in self.STORES:
            raise ValueError(f"unknown stage store '{name}'; known: {list(self.STORES)}")
        return self.root / name

    def output(self, store: str, key: str) -> Path:
        """The output folder of the stage run with this key (the first KEY_CHARS of its sha256)."""
        return self.store(store) / key[: self.KEY_CHARS]

    def latest(self, store: str) -> Path:
        """A link to the stage's newest output folder."""
        return self.store(store) / "latest"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def run_reports(self, run_id: str) -> Path:
        """The report folder of one MLflow run (reports are never shared between runs)."""
        return self.reports / run_id

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    # Services
    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"


def point_latest(link: Path, target: Path) -> None:
    """Make `link` a relative symlink to `target`, replaced atomically."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.name)
    os.replace(tmp, link)


def mlflow_command() -> str:
    """The `mlflow` CLI of this environment by its absolute path (a line to copy into a terminal whose PATH may
    lack the venv), or plain `mlflow` when it has none."""
    cli = Path(sys.executable).parent / "mlflow"
    return str(cli) if cli.is_file() else "mlflow"
