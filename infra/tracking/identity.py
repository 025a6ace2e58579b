"""What a run was: its preset, overrides, commit, machine, packages and precision, as one record.

Its preset and overrides, what that changed from the preset, the git commit (and whether the tree
was dirty), the machine, the key package versions, and the precision each training stage trained in
and why. One record, shown three ways: rows of the report
card's header, params and tags of the parent MLflow run, and tags and description of the
registered model version.

    identity = RunIdentity.here(preset, overrides, differences)     # at the start of the run
    identity = identity.with_precision(stage_precision(stage_runs))   # after training
"""
from __future__ import annotations

import platform
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

from pydantic import BaseModel

from infra.machine import machine
from infra.tracking.provenance import git_state
from infra.tracking.redaction import redact

# mlflow is imported inside the functions that use it: a rank that never logs, a data worker and `llmforge --help`
# do not pay for its import.

KEY_PACKAGES = ("torch", "deepspeed", "mlflow", "prefect", "transformers")


def package_versions(names: tuple[str, ...] = KEY_PACKAGES) -> dict[str, str]:
    """`{package: version}` of the installed ones among `names`, plus python."""
    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


class RunIdentity(BaseModel):
    """What one pipeline (or data) run was."""

    preset: str
    overrides: list[str] = []
    differences: dict[str, tuple[str, str]] = {}  # config key: (the preset's value, this run's)
    git_commit: str | None = None
    git_dirty: bool | None = None
    machine: str = ""
    packages: dict[str, str] = {}
    precision: dict[str, str] = {}  # training stage: "fp32 (auto: a bf16 matmul ran only 0.025x ...)"

    @classmethod
    def here(cls, preset: str, overrides: list[str] | None = None,
             differences: Mapping[str, tuple[str, str]] | None = None) -> "RunIdentity":
        """This process's run: git state of the checkout, this machine, the installed packages."""
        git = git_state()
        return cls(preset=preset, overrides=[redact_override(o) for o in overrides or []],
                   differences={k: (redact(k, a), redact(k, b)) for k, (a, b) in (differences or {}).items()},
                   git_commit=git.get("commit"), git_dirty={"true": True, "false": False}.get(git.get("dirty", "")),
                   machine=machine(), packages=package_versions())

    def with_precision(self, precision: Mapping[str, str]) -> "RunIdentity":
        return self.model_copy(update={"precision": dict(precision)})

    @property
    def commit_text(self) -> str:
        if self.git_commit is None:
            return "not a git checkout"
        return self.git_commit[:12] + (" (dirty: uncommitted changes)" if self.git_dirty else "")

    @property
    def versions_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.packages.items())

    def changes_text(self, stage: str | None = None) -> str:
        """What differs from the preset (only keys under `stage.` when given): "near.threshold 0.7 → 0.5"."""
        shown = [(k, a, b) for k, (a, b) in sorted(self.differences.items())
                 if stage is None or k.startswith(stage + ".")]
        return "; ".join(f"{k.removeprefix(stage + '.') if stage else k} {a} → {b}" for k, a, b in shown)

    def params(self) -> dict[str, str]:
        """The run's configuration beyond its config's own keys: which preset, which overrides."""
        return {"run.preset": self.preset, "run.overrides": " ".join(self.overrides) or "(none)"}

    def tags(self) -> dict[str, str]:
        tags = {"llmforge.preset": self.preset, "llmforge.overrides": " ".join(self.overrides) or "(none)",
                "llmforge.machine": self.machine, "llmforge.versions": self.versions_text}
        if self.git_commit is not None:
            tags["llmforge.git_commit"] = self.git_commit
        if self.git_dirty is not None:
            tags["llmforge.git_dirty"] = str(self.git_dirty).lower()
        tags.update({f"llmforge.precision.{stage}": text for stage, text in self.precision.items()})
        return tags

    def description(self, stage: str | None = None) -> str:
        """One paragraph for a run's (or model version's) description: the preset and what differs from it."""
        changes = self.changes_text(stage)
        what = f"preset `{self.preset}`" + (f", changed: {changes}" if changes else ", unchanged")
        return f"{what}. Commit {self.commit_text}; {self.machine}."  # `llmforge runs` shows what precedes ". Commit "

    def rows(self) -> list[tuple[str, str]]:
        """(what, value) rows for the report card's header."""
        rows = [("preset", self.preset), ("overrides (--set)", " ".join(self.overrides) or "none"),
                ("differs from the preset", self.changes_text() or "nothing"),
                ("git commit", self.commit_text), ("machine", self.machine)]
        rows += [(f"precision, {stage}", text) for stage, text in self.precision.items()]
        return rows + [("packages", self.versions_text)]


def redact_override(pair: str) -> str:
    key, sep, value = pair.partition("=")
    return f"{key}{sep}{redact(key.strip(), value)}" if sep else pair


def stage_precision(stage_runs: Mapping[str, str | None]) -> dict[str, str]:
    """`{stage: "fp32 (why)"}` from the `precision_used`/`precision_reason` params each training stage's run logged."""
    from mlflow.tracking import MlflowClient

    client, found = MlflowClient(), {}
    for stage, run_id in stage_runs.items():
        if not run_id:
            continue
        params = client.get_run(run_id).data.params
        if "precision_used" in params:
            found[stage] = f"{params['precision_used']} ({params.get('precision_reason', 'reason not logged')})"
    return found
