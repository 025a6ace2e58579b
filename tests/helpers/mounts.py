"""`mounts`: small tmpfs mounts (read-only, or a few MiB to fill) for the disk tests; skips where mounting fails."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def _mount(target: Path, options: str) -> None:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); needs root with CAP_SYS_ADMIN")


@pytest.fixture
def mounts(tmp_path):
    """`mounts(name, options)`: a tmpfs mounted with `options` at tmp_path/name; unmounted after the test."""
    made: list[Path] = []

    def mount(name: str, options: str) -> Path:
        target = tmp_path / name
        _mount(target, options)
        made.append(target)
        return target

    yield mount
    for target in reversed(made):
        subprocess.run(["umount", "-l", str(target)], check=False)
