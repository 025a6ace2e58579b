"""Readers of source files, shared by pretraining (collect) and SFT sources.

Each reader yields (locator, record | Rejection) and never raises on bad data: a record
that cannot be read (malformed JSON, invalid UTF-8, an over-long line, a corrupt
compressed file, a file over its size cap, a FIFO or device, a compression we cannot
inflate) becomes a Rejection with a short machine-readable reason, and the caller
quarantines it. Compression is judged by a file's first bytes (tasks/data/input_files.py). Hostile input stays bounded: files are read in
chunks (a run of blank lines costs its bytes, not a call per line), an over-long line or
file is hashed as it streams, never held, and a compressed file stops at
`max_inflated_bytes`. What a record must hold (a text field, a conversation) is the
caller's business.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from tasks.data.catalog import MAX_INFLATED_BYTES
from tasks.data.input_files import NotARegularFile, UnsupportedCompression, open_decompressed, open_regular
from tasks.data.rejection import Rejection
from tasks.data.text_normalize import has_visible_text

BATCH_ROWS = 2048


def check_string(value: Any, what: str) -> str:
    """Return `value` if it is usable text, else raise Rejection saying what is wrong with `what`."""
    if value is None:
        raise Rejection("missing_field", f"no {what}")
    if not isinstance(value, str):
        raise Rejection("wrong_type", f"{what} is {type(value).__name__}, expected a string", text=repr(value)[:1000])
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates from JSON escapes
        raise Rejection("invalid_unicode", f"{what}: {exc}", text=value.encode("utf-8", "replace").decode()) from None
    if not has_visible_text(value):  # zero-width and bidi controls alone show nothing either
        raise Rejection("empty_text", f"{what} is empty or only whitespace, control or invisible characters")
    return value


def decode_utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejection("invalid_utf8", f"byte {exc.start}: {exc.reason}", raw=raw, text=raw.decode("utf-8", "replace")) from None


CHUNK_BYTES = 1 << 20  # read size: blank runs and long lines are handled per chunk, not per line
PREFIX_BYTES = 64 << 10  # what an oversize record keeps of itself for the quarantine file
_BLANKS = re.compile(rb"[ \t\r\n\x0b\x0c]*")  # what bytes.strip() strips: a blank line holds only these
class _CappedReader:
    """Chunks of a binary file object, at most `cap` bytes in all (None: no cap); past the
    cap, reads return b"" and `over` is set. `read1` never loses bytes it already inflated
    when a later part of a corrupt gzip raises."""

    def __init__(self, fh, cap: int | None):
        self.fh, self.left, self.over = fh, cap, False

    def read(self, n: int = CHUNK_BYTES) -> bytes:
        if self.left is None:
            return self.fh.read1(n)
        if self.left <= 0:
            self.over = self.over or bool(self.fh.read1(1))
            return b""
        chunk = self.fh.read1(min(n, self.left))
        self.left -= len(chunk)
        return chunk


class _Streamed(NamedTuple):
    prefix: bytes  # the first PREFIX_BYTES
    size: int  # bytes, without the newline
    sha256: str  # of those bytes
    after: bytes  # what was read past the newline
    ended: bool  # the end was reached before the inflated-bytes cap
    blank: bool  # only whitespace


def stream_prefix_and_digest(head: bytes, start: int, src: _CappedReader, stop_at_newline: bool) -> _Streamed:
    """Read on from `head[start:]` (what is already read) to the end of the line (or of the
    file), holding one chunk at a time, and say what it was."""
    h = hashlib.sha256()
    prefix = b""
    size = 0
    blank = True
    chunk = head
    while True:
        nl = chunk.find(b"\n", start) if stop_at_newline else -1
        end = nl if nl >= 0 else len(chunk)
        h.update(memoryview(chunk)[start:end])  # a view: no copy of a chunk
        blank = blank and _BLANKS.fullmatch(chunk, start, end) is not None
        if len(prefix) < PREFIX_BYTES:
            prefix += chunk[start : min(end, start + PREFIX_BYTES - len(prefix))]
        size += end - start
        if nl >= 0:
            return _Streamed(prefix, size, h.hexdigest(), chunk[nl + 1 :], True, blank)
        chunk, start = src.read(), 0
        if not chunk:
            return _Streamed(prefix, size, h.hexdigest(), b"", not src.over, blank)


def jsonl_lines(
    path: Path, max_line_bytes: int, max_inflated_bytes: int | None = MAX_INFLATED_BYTES
) -> Iterator[tuple[str, bytes | Rejection]]:
    """Yield ("line:N", raw line | Rejection) for each non-blank line of a JSONL file, plain
    or gzip, bz2, xz or zstd by its first bytes.

    Reads in chunks, so runs of blank lines cost their bytes, not a call per line. A line
    over `max_line_bytes` (its newline counted) is rejected with its first 64 KiB and the
    sha256 of the whole line, read without holding it; a compressed file inflating past
    `max_inflated_bytes` (None: no cap) ends with its rest as one `oversize_file` rejection;
    a truncated or corrupt compressed file ends with one `corrupt_file` rejection; a FIFO or
    device, or a compression we do not read, is one rejection naming it, before any read."""
    try:
        fh, fmt = open_decompressed(path)
    except NotARegularFile as exc:
        yield "file", Rejection("not_a_regular_file", str(exc))
        return
    except UnsupportedCompression as exc:
        yield "file", Rejection("unsupported_compression", str(exc))
        return
    cap = max_inflated_bytes if fmt else None
    buf, pos, lineno = b"", 0, 0
    with fh:
        src = _CappedReader(fh, cap)
        try:
            while True:
                blank_end = _BLANKS.match(buf, pos).end()
                last_nl = buf.rfind(b"\n", pos, blank_end)
                if last_nl >= 0:  # whole blank lines: skip them in one step, counting them
                    lineno += buf.count(b"\n", pos, last_nl + 1)
                    pos = last_nl + 1
                nl = buf.find(b"\n", pos)
                if nl >= 0 and nl + 1 - pos <= max_line_bytes:
                    lineno += 1
                    yield f"line:{lineno}", buf[pos : nl + 1]
                    pos = nl + 1
                    continue
                if nl >= 0 or len(buf) - pos > max_line_bytes:
                    line = stream_prefix_and_digest(buf, pos, src, stop_at_newline=True)
                    buf, pos = line.after, 0
                    if not line.ended:  # the cap fell inside this line: it is the start of the rest
                        yield f"line:{lineno + 1}+", _oversize(line.prefix, cap, lineno + 1)
                        return
                    lineno += 1
                    if not line.blank:  # a blank line is layout at any length
                        yield f"line:{lineno}", _too_long(line, max_line_bytes)
                    continue
                chunk = src.read()
                if not chunk:
                    rest = buf[pos:]
                    if src.over:
                        yield f"line:{lineno + 1}+", _oversize(rest[:PREFIX_BYTES], cap, lineno + 1)
                    elif rest.strip():  # a last line without a newline
                        yield f"line:{lineno + 1}", rest
                    return
                if chunk.isspace() and (pos == len(buf) or buf[pos:].isspace()):
                    # A chunk of nothing but blank lines, the shape of a newline bomb: count them at C speed.
                    last_nl = chunk.rfind(b"\n")
                    if last_nl >= 0:
                        lineno += chunk.count(b"\n")
                        buf, pos = chunk[last_nl + 1 :], 0
                        continue
                buf = buf[pos:] + chunk
                pos = 0
        except (EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError, OSError, ValueError) as exc:
            # ValueError: pyarrow's zstd reports a corrupt frame as ArrowInvalid.
            partial = buf[pos : pos + PREFIX_BYTES]  # the start of the line the damage cut, if any
            yield f"line:{lineno + 1}", Rejection("corrupt_file", f"{type(exc).__name__}: {exc}", raw=partial or None)


def _too_long(line: _Streamed, max_line_bytes: int) -> Rejection:
    return Rejection.with_prefix(
        "line_too_long",
        f"{line.size} bytes before its newline, over max_line_bytes={max_line_bytes} (newline counted); "
        f"sha256 of the line without its newline={line.sha256}; raw holds its first {len(line.prefix)} bytes",
        line.prefix,
    )


def _oversize(prefix: bytes, cap: int | None, lineno: int) -> Rejection:
    return Rejection.with_prefix(
        "oversize_file",
        f"inflated past max_inflated_bytes={cap} inside line {lineno}; the rest of the file, from that line on, "
        f"was not read (raw holds its first {len(prefix)} bytes); raise max_inflated_bytes in the source's "
        "catalog entry to read it",
        prefix,
    )


def read_capped_file(path: Path, max_bytes: int) -> bytes | Rejection:
    """A whole file's bytes, or past `max_bytes` an `oversize_file` rejection with its first
    64 KiB and the sha256 of the whole file, read in chunks rather than held."""
    try:
        fh = open_regular(path)
    except NotARegularFile as exc:
        return Rejection("not_a_regular_file", str(exc))
    with fh:
        raw = fh.read(max_bytes + 1)  # not stat(): a file growing while read is still capped
        if len(raw) <= max_bytes:
            return raw
        whole = stream_prefix_and_digest(raw, 0, _CappedReader(fh, None), stop_at_newline=False)
    return Rejection.with_prefix(
        "oversize_file",
        f"{whole.size} bytes > max_file_bytes={max_bytes}; sha256 of the file={whole.sha256}; raw holds its first "
        f"{len(whole.prefix)} bytes; raise max_file_bytes in the source's catalog entry to read it",
        whole.prefix,
    )


def parse_json_line(raw: bytes) -> tuple[Any, str]:
    """(parsed value | Rejection, the line as text) of one JSONL line."""
    try:
        line = decode_utf8(raw)
    except Rejection as rej:
        return rej, ""
    try:
        return json.loads(line), line
    except (json.JSONDecodeError, RecursionError) as exc:
        return Rejection("malformed_json", str(exc)[:200], raw=raw, text=line[:100_000]), line


def jsonl_records(path: Path, max_line_bytes: int, max_inflated_bytes: int | None = MAX_INFLATED_BYTES) -> Iterator[tuple[str, Any]]:
    """Yield ("line:N", parsed JSON value | Rejection) for each record of a JSONL(.gz) file."""
    for locator, raw in jsonl_lines(path, max_line_bytes, max_inflated_bytes):
        yield locator, raw if isinstance(raw, Rejection) else parse_json_line(raw)[0]

