"""YAML is read without anchors and aliases: a "billion laughs" file fails at once, naming the file and line."""
from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from pydantic import ValidationError

from flows.config import parse_overrides
from infra.config import ConfigError, StrictModel, format_validation_error, read_yaml

ROOT = Path(__file__).resolve().parents[3]

# 9 levels of 9 aliases: about 400 bytes that expand into 9**9 (387 million) strings.
LAUGHS = """\
name: laughs
kind: builtin
builtin: python_docs
licence: PSF-2.0
filters:
  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
  h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
  i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_billion_laughs_is_refused_at_once_naming_file_and_line(tmp_path):
    f = tmp_path / "laughs.yaml"
    f.write_text(LAUGHS)
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        read_yaml(f)
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    msg = str(err.value)
    assert msg.startswith(f"{f}: line 6: YAML anchor '&a'") and "write the values out" in msg, msg
    assert elapsed < 0.1 and peak < 5_000_000, (elapsed, peak)


def test_billion_laughs_catalog_fails_in_well_under_a_second(tmp_path):
    # A separate process: without the refusal this eats gigabytes for most of a minute.
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "laughs.yaml").write_text(LAUGHS)
    code = (
        "import sys, time\n"
        "from tasks.data.catalog import load_catalog\n"
        "t = time.perf_counter()\n"
        "try:\n    load_catalog(sys.argv[1])\n"
        "except Exception as exc:\n    print(type(exc).__name__, time.perf_counter() - t); print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(catalog)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    first, _, message = proc.stdout.partition("\n")
    kind, seconds = first.split()
    assert kind == "ConfigError" and float(seconds) < 0.5, proc.stdout + proc.stderr
    assert "laughs.yaml: line 6" in message and "unprintable" not in message


@pytest.mark.parametrize("text, line, what", [
    ("a: &x 1\nb: 2\n", 1, "anchor '&x'"),
    ("base: {lr: 1}\nother:\n  <<: *base\n", 3, "alias '*base'"),
    ("a:\n  - 1\n  - &big [1, 2]\n", 3, "anchor '&big'"),
])
def test_any_anchor_or_alias_is_refused(tmp_path, text, line, what):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=rf"c\.yaml: line {line}: YAML {what.replace('*', '[*]')}"):
        read_yaml(f)


def test_override_values_are_read_the_same_way():
    with pytest.raises(ConfigError, match=r"override 'name=\[&a \[1\], \*a\]': line 1: YAML anchor '&a'"):
        parse_overrides(["name=[&a [1], *a]"])
    assert parse_overrides(["a=[1, {b: c}]", "s=a&b*c"]) == {"a": [1, {"b": "c"}], "s": "a&b*c"}


def test_shipped_yaml_reads_without_anchors():
    files = [*sorted((ROOT / "data_catalog").glob("*.yaml")), *sorted((ROOT / "infra" / "presets").glob("*.yaml"))]
    assert files and all(isinstance(read_yaml(f), dict) for f in files)


def test_validation_errors_show_only_short_values():
    class Section(StrictModel):
        steps: int = 1
        lr: float = 1.0

    def message(data: dict) -> str:
        with pytest.raises(ValidationError) as err:
            Section.model_validate(data)
        return format_validation_error(err.value, "p.yaml")

    assert message({"lr": "x" * 10_000}).endswith("(got '" + "x" * 80 + "'...)")
    assert "an integer of" in message({"lr": 10**5000})  # str() of it would raise
    nested: list = ["lol"] * 9
    for _ in range(8):
        nested = [nested] * 9
    text = message({"steps": nested, "k" * 1000: 1})
    assert len(text) < 400 and "unprintable" not in text, text
