"""Opening a source's files safely: only regular files, decompressed by what they hold.

A FIFO or a device named as a source file would block `open()` forever (a FIFO waits for a
writer) or read without end, so files are opened non-blocking and checked with `fstat`
before a byte is read. Compression is decided by the file's first bytes, not its name: a
plain file called `.jsonl.gz` is read as plain, a `.jsonl` that is really bzip2 is
inflated. Formats we cannot inflate are named and refused, never read as text.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

# First bytes of each format we inflate, and of those we recognise but cannot. bz2's "BZh" is plain text, so its
# magic takes the block size digit and the first block's (or the empty stream's end) magic too: a text file that
# begins "BZh..." is read as text.
MAGIC = {"gzip": b"\x1f\x8b", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd"}
BZ2_MAGIC = re.compile(rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)")
HEAD_BYTES = 10  # what sniff needs to see
UNSUPPORTED_MAGIC = {
    "zip": b"PK\x03\x04", "7z": b"7z\xbc\xaf\x27\x1c", "lz4": b"\x04\x22\x4d\x18", "rar": b"Rar!\x1a\x07",
}


class NotARegularFile(OSError):
    """A path that is a FIFO, device, socket or folder where a data file was expected."""


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for binary reading, or NotARegularFile naming what it is: never blocks on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(f"{path} is {file_kind(mode)}, not a regular file; remove it from the source")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def sniff(head: bytes) -> str | None:
    """The compression format `head` (a file's first bytes) starts with, or None for plain."""
    for name, magic in (MAGIC | UNSUPPORTED_MAGIC).items():
        if head.startswith(magic):
            return name
    return "bz2" if BZ2_MAGIC.match(head) else None


def compression_of(path: Path) -> str | None:
    with open_regular(path) as fh:
        return sniff(fh.read(HEAD_BYTES))


class UnsupportedCompression(ValueError):
    def __init__(self, path: Path, fmt: str):
        super().__init__(f"{path} is {fmt}-compressed (by its first bytes), which is not read; "
                         f"unpack it or recompress it as gzip, bz2, xz or zstd")
        self.fmt = fmt


def open_decompressed(path: Path) -> tuple[BinaryIO, str | None]:
    """(binary stream of `path`'s content, its compression or None), inflating gzip, bz2, xz
    and zstd (zstd through pyarrow's codec); other recognised formats raise UnsupportedCompression."""
    raw = open_regular(path)
    fmt = sniff(raw.read(HEAD_BYTES))
    raw.seek(0)
    if fmt is None:
        return raw, None
    if fmt == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb"), fmt
    if fmt == "bz2":
        return bz2.BZ2File(raw, "rb"), fmt
    if fmt == "xz":
        return lzma.LZMAFile(raw, "rb"), fmt
    if fmt == "zstd":
        return _ClosingStream(pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd"), raw), fmt
    raw.close()
    raise UnsupportedCompression(path, fmt)


class _ClosingStream:
    """A pyarrow stream that closes the Python file under it too."""

    def __init__(self, stream, raw):
        self.stream, self.raw = stream, raw

    def read1(self, n: int) -> bytes:
        return self.stream.read(n)

    def read(self, n: int = -1) -> bytes:
        return self.stream.read() if n is None or n < 0 else self.stream.read(n)

    def close(self) -> None:
        self.stream.close()
        self.raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
