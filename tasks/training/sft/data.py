"""SFT examples: conversations read from SFT catalog sources, with bad records quarantined.

A source is a JSONL file, a Parquet file, a local `datasets` dataset or a built-in set.
Records hold either an instruction/response pair or a `messages` list of
{role, content} turns (user first, alternating, ending with the assistant). Every record
read becomes exactly one example or one rejected row with its reason (malformed JSON,
missing or non-string field, empty text, bad role order, a special token in the text,
...), so for every source: read == examples + rejected.

The built-in sets need no network and are honestly derived from local material:

* `stdlib_docstrings`: "What does `json.dumps` do?" -> the first sentence of that
  function's docstring, over a fixed list of standard-library modules that have no
  import side effects.
* `arithmetic`: sums from the `sft` split of the arithmetic task's trained range
  (tasks/eval/arithmetic.py) with `<answer>n</answer>` responses (never the GRPO or eval
  questions), and `abstain_n` sums of its abstention range answered `<answer>unknown</answer>`.

SFT source definitions are YAML files with an `sft_*` kind; `load_sft_catalog` reads them
from a folder (e.g. `data_catalog/sft/`) and skips any pretraining definitions there.
"""
from __future__ import annotations

import importlib
import inspect
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from infra.config import ConfigError, StrictModel, parse_config, read_yaml
from models.special_tokens import SPECIAL_TOKENS
from tasks.data.catalog import SourceBase, check_hf_paths, folder_glob, is_within, match_files
from tasks.data.documents import make_doc_id
from tasks.data.hf_source import load_hf
from tasks.data.parquet_reader import parquet_records
from tasks.data.readers import check_string, jsonl_records
from tasks.data.rejection import Rejection
from tasks.eval.arithmetic import ArithmeticTask
from tasks.eval.rewards import ABSTENTION
from tasks.training.config import ArithmeticSftOptions, SftBuiltin

SftKind = Literal["sft_jsonl", "sft_parquet", "sft_hf_dataset", "sft_builtin"]

# Pure modules (no import side effects, nothing platform-specific) whose docstrings feed
# the built-in set; a fixed list so the set is the same on every run of one Python.
STDLIB_DOC_MODULES: tuple[str, ...] = (
    "base64", "binascii", "bisect", "calendar", "cmath", "collections", "colorsys", "copy",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fnmatch", "fractions",
    "functools", "graphlib", "heapq", "html", "ipaddress", "itertools", "json", "keyword",
    "math", "operator", "posixpath", "pprint", "random", "re", "shlex", "statistics",
    "string", "struct", "textwrap", "unicodedata", "urllib.parse", "uuid", "zlib",
)


class SftFields(StrictModel):
    """Which record fields hold the conversation."""

    instruction: str = "instruction"
    response: str = "response"
    messages: str | None = None  # when set, this field holds the [{role, content}, ...] list instead


class SftSourceConfig(SourceBase):
    """One SFT source of the catalog."""

    kind: SftKind
    fields: SftFields = Field(default_factory=SftFields)
    max_examples: int | None = Field(default=None, gt=0)
    builtin: SftBuiltin | None = None
    arithmetic: ArithmeticSftOptions = Field(default_factory=ArithmeticSftOptions)
    max_chars: int = Field(default=20_000, gt=0)  # longer conversations are quarantined
    max_line_bytes: int = Field(default=1 << 20, gt=0)

    @model_validator(mode="after")
    def _kind_fields(self) -> "SftSourceConfig":
        if self.kind == "sft_builtin" and self.builtin is None:
            raise ValueError("kind 'sft_builtin' needs key 'builtin' (stdlib_docstrings or arithmetic)")
        if self.kind == "sft_hf_dataset" and self.hf is None:
            raise ValueError("kind 'sft_hf_dataset' needs key 'hf' (name, data_files, split)")
        if self.kind in ("sft_jsonl", "sft_parquet") and not self.path:
            raise ValueError(f"kind '{self.kind}' needs key 'path'")
        return self


@dataclass(frozen=True)
class SftExample:
    """One conversation to train on, with its provenance."""

    source: str
    messages: list[dict] = field(hash=False)
    licence: str | None = None
    path: str | None = None
    locator: str | None = None

    @property
    def example_id(self) -> str:
        return make_doc_id(self.source, self.path or "", self.locator or "")

    @property
    def held_out(self) -> bool:
        """Made for validation only (a built-in set's `val_abstain_n`): never trained on, whatever val_fraction says."""
        return (self.locator or "").startswith(HELD_OUT_LOCATOR)

    @property
    def instruction(self) -> str:
        return self.messages[0]["content"]

    @property
    def response(self) -> str:
        return self.messages[-1]["content"]


def default_sft_sources() -> list[SftSourceConfig]:
    """The built-in SFT sources used when no SFT catalog is given."""
    return [
        SftSourceConfig(name="stdlib_docstrings", kind="sft_builtin", builtin="stdlib_docstrings", licence="PSF-2.0"),
        SftSourceConfig(name="arithmetic", kind="sft_builtin", builtin="arithmetic", licence="CC0-1.0"),
    ]


def load_sft_catalog(folder: Path) -> list[SftSourceConfig]:
    """Read and validate the SFT source definitions (`*.yaml` whose kind starts with `sft_`) in `folder`.

    Other definitions (pretraining sources) are skipped, so SFT sources may share a folder
    with them or have their own.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: SFT catalog folder not found")
    files = sorted(list(folder.glob("*.yaml")) + list(folder.glob("*.yml")))
    sources: list[SftSourceConfig] = []
    seen: dict[str, Path] = {}
    for f in files:
        data = read_yaml(f)
        if not str(data.get("kind", "")).startswith("sft_"):
            continue
        src = parse_config(SftSourceConfig, data, str(f))
        if src.name in seen:
            raise ConfigError(f"{f}: key 'name': '{src.name}' is also defined in {seen[src.name]}")
        seen[src.name] = f
        sources.append(src)
    if not sources:
        raise ConfigError(f"{folder}: no SFT source definitions (*.yaml with kind sft_jsonl, sft_parquet, sft_hf_dataset or sft_builtin)")
    return sources


# Record -> conversation ----------------------------------------------------------


def _check_content(value: Any, what: str) -> str:
    value = check_string(value, what)
    for token in SPECIAL_TOKENS:
        if token in value:
            # Would forge a turn boundary in the chat template.
            raise Rejection("special_token_in_text", f"{what} contains {token!r}")
    return value


def _check_turns(turns: Any, key: str) -> list[dict]:
    if turns is None:
        raise Rejection("missing_field", f"no '{key}' field")
    if not isinstance(turns, list):
        raise Rejection("wrong_type", f"'{key}' is {type(turns).__name__}, expected a list of {{role, content}}")
    if len(turns) < 2:
        raise Rejection("invalid_role_order", f"'{key}' has {len(turns)} turn(s); need a user turn then an assistant turn")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise Rejection("wrong_type", f"'{key}'[{i}] is {type(turn).__name__}, expected an object")
        role = turn.get("role")
        if role not in ("user", "assistant"):
            raise Rejection("invalid_role", f"'{key}'[{i}].role is {role!r}, expected 'user' or 'assistant'")
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            raise Rejection("invalid_role_order", f"'{key}'[{i}] is {role!r}, expected {expected!r} (alternate, user first)")
        out.append({"role": role, "content": _check_content(turn.get("content"), f"'{key}'[{i}].content")})
    if out[-1]["role"] != "assistant":
        raise Rejection("invalid_role_order", f"'{key}' ends with a user turn; nothing to train on")
    return out


def record_messages(record: Any, fields: SftFields, max_chars: int) -> list[dict]:
    """The conversation in a record, or raise Rejection with the reason."""
    if not isinstance(record, dict):
        raise Rejection("not_an_object", f"record is {type(record).__name__}, expected an object")
    if fields.messages is not None:
        messages = _check_turns(record.get(fields.messages), fields.messages)
    else:
        messages = [
            {"role": "user", "content": _check_content(record.get(fields.instruction), f"'{fields.instruction}'")},
            {"role": "assistant", "content": _check_content(record.get(fields.response), f"'{fields.response}'")},
        ]
    size = sum(len(m["content"]) for m in messages)
    if size > max_chars:
        raise Rejection("too_long", f"{size} characters > max_chars={max_chars}")
    return messages


# Readers: yield (path, locator, record | Rejection) ------------------------------


def source_files(source: SftSourceConfig, root: Path) -> list[Path]:
    """The files of a file-based source, sorted; an error names the source when none match."""
    pattern = source.path or ""
    files = [f for f in match_files(root, pattern, folder_glob(source.kind))[0] if f.is_file()]
    if not files:
        raise ConfigError(f"SFT source '{source.name}': key 'path': {pattern} matches no file (looked in {root})")
    if not source.allow_outside_roots:
        base = root.resolve()
        for f in files:
            if not is_within(f.resolve(), [base]):  # resolves links, so a symlink out of the folder is caught too
                raise ConfigError(
                    f"SFT source '{source.name}': key 'path': {f} resolves outside {base}; "
                    "set allow_outside_roots: true in this source to allow it"
                )
    return files


def _read_file(path: Path, source: SftSourceConfig) -> Iterator[tuple[str, Any]]:
    if source.kind == "sft_jsonl":
        return jsonl_records(path, source.max_line_bytes)
    fields = source.fields
    # Missing columns are left out of the record, so each row is rejected as missing_field.
    return parquet_records(path, [fields.messages] if fields.messages else [fields.instruction, fields.response])


# The "path" of built-in arithmetic examples: it names the set in their ids (and so in the
# hashed train/val split). A fixed name, not the task module's path (tasks/eval/arithmetic.py):
# moving the module must not change the examples, their split or the results of the same seeds.
ARITHMETIC_ID_PATH = "tasks/arithmetic.py"
HELD_OUT_LOCATOR = "held-out:"  # a built-in example's locator prefix: validation only (SftExample.held_out)
_SIGNATURE = re.compile(r"^[\w.]+\(.*\)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def first_sentence(doc: str | None) -> str | None:
    """The first sentence of a docstring's first prose paragraph (signature lines skipped), or None."""
    if not doc or not isinstance(doc, str):
        return None
    for para in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        lines = [ln.strip() for ln in para.strip().splitlines()]
        if not lines or _SIGNATURE.match(lines[0]) or "-->" in lines[0]:
            continue  # C functions often start with "name(args) -> result"
        text = " ".join(lines)
        sentence = _SENTENCE_END.split(text, maxsplit=1)[0].strip()
        if sentence.endswith(".") and 15 <= len(sentence) <= 300:
            return sentence
        return None
    return None


def stdlib_docstring_examples() -> Iterator[tuple[str, str, Any]]:
    """Yield (path, locator, record) for public functions and classes of STDLIB_DOC_MODULES."""
    seen: set[int] = set()
    for modname in STDLIB_DOC_MODULES:
        module = importlib.import_module(modname)
        path = getattr(module, "__file__", None) or f"<builtin {modname}>"
        short = modname.rsplit(".", 1)[-1]
        for name in sorted(vars(module)):
            if name.startswith("_"):
                continue
            obj = vars(module)[name]
            is_class = inspect.isclass(obj)
            if not (is_class or inspect.isroutine(obj)) or id(obj) in seen:
                continue
            owner = getattr(obj, "__module__", None) or ""
            # Only things the module defines (or its C accelerator _name does), not re-exports.
            if owner not in (modname, f"_{short}", short):
                continue
            sentence = first_sentence(obj.__doc__)  # not inspect.getdoc: no docs inherited from a base class
            if sentence is None:
                continue
            seen.add(id(obj))
            question = f"What is `{modname}.{name}`?" if is_class else f"What does `{modname}.{name}` do?"
            yield path, f"{modname}.{name}", {"instruction": question, "response": sentence}


def _arithmetic_examples(opts: ArithmeticSftOptions, task: ArithmeticTask) -> Iterator[tuple[str, str, Any]]:
    problems = task.problems(opts.n, opts.seed, split="sft")
    unsure = set(random.Random(opts.seed).sample(range(len(problems)), opts.abstain_in_range))
    for i, p in enumerate(problems):
        response = ABSTENTION if i in unsure else p.response
        yield ARITHMETIC_ID_PATH, f"problem:{i}", {"instruction": p.question, "response": response}
    if opts.abstain_n or opts.val_abstain_n:
        unknown = task.abstained(opts.abstain_n + opts.val_abstain_n, opts.seed, split="sft",
                                 above=opts.abstained_above(task))
        for i, p in enumerate(unknown):
            locator = f"abstain:{i}" if i < opts.abstain_n else f"{HELD_OUT_LOCATOR}abstain:{i - opts.abstain_n}"
            yield ARITHMETIC_ID_PATH, locator, {"instruction": p.question, "response": ABSTENTION}


def iter_source_records(source: SftSourceConfig, root: Path,
                        task: ArithmeticTask | None = None) -> Iterator[tuple[str, str, Any]]:
    """Yield (path, locator, record | Rejection) for every record of a source, in a fixed order; `task`: the
    arithmetic task the built-in arithmetic set draws from (default ArithmeticTask())."""
    if source.kind == "sft_builtin":
        if source.builtin == "stdlib_docstrings":
            yield from stdlib_docstring_examples()
        else:
            yield from _arithmetic_examples(source.arithmetic, task or ArithmeticTask())
        return
    if source.kind == "sft_hf_dataset":
        assert source.hf is not None
        # The same rule as a file source's path: its name and data_files lie under `root` unless allowed.
        check_hf_paths(source.hf, root, [root.resolve()], source.allow_outside_roots, f"SFT source '{source.name}'")
        for i, rec in enumerate(load_hf(source.hf, root)):
            yield f"hf:{source.hf.name}", f"row:{i}", rec
        return
    for path in source_files(source, root):
        for locator, rec in _read_file(path, source):
            yield str(path), locator, rec


def load_sft_examples(
    sources: Sequence[SftSourceConfig] | None = None, root: Path | str = ".", task: ArithmeticTask | None = None
) -> tuple[list[SftExample], list[dict]]:
    """(examples, rejected) from `sources` (default: the built-in ones), paths relative to `root`; the built-in
    arithmetic set draws from `task`.

    Each rejected row is {source, path, locator, reason, detail}. `max_examples` caps the
    examples kept per source; reading stops there, so read == kept + rejected still holds.
    """
    root = Path(root)
    examples: list[SftExample] = []
    rejected: list[dict] = []
    for source in sources if sources is not None else default_sft_sources():
        kept = 0
        for path, locator, rec in iter_source_records(source, root, task):
            try:
                if isinstance(rec, Rejection):
                    raise rec
                messages = record_messages(rec, source.fields, source.max_chars)
            except Rejection as rej:
                rejected.append({"source": source.name, "path": path, "locator": locator, "reason": rej.reason, "detail": rej.detail})
                continue
            examples.append(SftExample(source=source.name, messages=messages, licence=source.licence, path=path, locator=locator))
            kept += 1
            if source.max_examples is not None and kept >= source.max_examples:
                break
    return examples, rejected


