"""DeepSpeed hostfiles, checked when the config is loaded rather than when the launcher reads them.

A hostfile has one node per line, `<host> slots=<N>`; blank lines and lines starting with `#`
are ignored. This is DeepSpeed's own grammar (`deepspeed.launcher.runner._parse_hostfile`),
a little stricter: N is ASCII digits and at least 1, and after it only a `# comment` may follow.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

MAX_HOSTFILE_BYTES = 1 << 20  # far more than any cluster's node list
FORMAT = "one node per line, '<host> slots=<N>' with N >= 1 (e.g. 'worker-1 slots=8'); '#' starts a comment"
_LINE = re.compile(r"(\S+)\s+slots=([0-9]+)(?:\s+#.*)?")


def _refuse(path: Path, why: str) -> PydanticCustomError:
    return PydanticCustomError("hostfile", "hostfile {path}: {why}; a DeepSpeed hostfile has {format}",
                               {"path": str(path), "why": why, "format": FORMAT})


def check_hostfile(path: Path) -> Path:
    """`path` when it is a readable DeepSpeed hostfile naming each node once; else an error naming the file and line."""
    if not path.is_file():
        raise _refuse(path, "file not found" if not path.exists() else "not a regular file")
    if path.stat().st_size > MAX_HOSTFILE_BYTES:
        raise _refuse(path, f"larger than {MAX_HOSTFILE_BYTES} bytes")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _refuse(path, f"cannot be read as UTF-8 text ({exc})") from None
    hosts: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if m is None or int(m.group(2)) < 1:
            shown = line[:80] + ("..." if len(line) > 80 else "")
            raise _refuse(path, f"line {number} {shown!r} is not '<host> slots=<N>'")
        host = m.group(1)
        if host in hosts:
            raise _refuse(path, f"line {number}: host {host!r} is already listed on line {hosts[host]}")
        hosts[host] = number
    if not hosts:
        raise _refuse(path, "lists no nodes")
    return path


def hostfile_nodes(path: Path) -> list[str]:
    """The hosts a checked hostfile names, in its order."""
    lines = (line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines())
    return [m.group(1) for line in lines if line and not line.startswith("#") and (m := _LINE.fullmatch(line))]


HostfilePath = Annotated[Path, AfterValidator(check_hostfile)]


def node_count(path: Path) -> int:
    """The nodes a checked hostfile lists: DeepSpeed starts `launch.num_procs` ranks on each."""
    lines = (line.strip() for line in check_hostfile(Path(path)).read_text(encoding="utf-8").splitlines())
    return sum(1 for line in lines if line and not line.startswith("#"))
