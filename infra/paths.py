"""The one place that knows where artifacts live.

Everything a run writes sits under one workspace folder (default `./work`, or
`$LLMFORGE_HOME`), so a run is easy to inspect, copy or delete.
"""
from __future__ import annotations

import os
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

    # Data stages
    @property
    def data(self) -> Path:
        return self.root / "data"

    def stage_dir(self, stage: str) -> Path:
        return self.data / stage

    @property
    def shards(self) -> Path:
        return self.data / "shards"

    @property
    def quarantine(self) -> Path:
        """Removed and rejected documents, with their reasons: nothing is lost."""
        return self.data / "removed"

    # Model stages
    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens"

    def checkpoints(self, stage: str) -> Path:
        return self.root / "checkpoints" / stage

    def exports(self, stage: str) -> Path:
        return self.root / "models" / stage

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    # Services
    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"
