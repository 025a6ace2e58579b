"""PII redaction stage: replace e-mail addresses and public IP addresses with placeholders.

Follows the spirit of the StarCoder PII pipeline: addresses that identify nobody are kept
(private, loopback, unspecified, link-local, multicast and reserved IPs, the documentation
ranges of RFC 5737/3849, and e-mail at the reserved example domains of RFC 2606), because
they are common in code and docs and teach the model nothing private. The stage removes
no document; it only rewrites text and counts what it replaced.
"""
from __future__ import annotations

import ipaddress
import re
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field

from infra.config import StrictModel
from infra.stages import Stage
from tasks.data.documents import DOCUMENT_SCHEMA, iter_batches
from tasks.data.step import DataStep, StageResult

STAGE = "pii"
BATCH_ROWS = 2048

IpKind = Literal["private", "loopback", "unspecified", "link_local", "multicast", "reserved", "documentation", "shared"]
ALL_IP_KINDS: list[IpKind] = ["private", "loopback", "unspecified", "link_local", "multicast", "reserved", "documentation", "shared"]

# Fixed lists rather than ipaddress.is_private, whose meaning changed between Python versions.
_NETWORKS: dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {
    "private": [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")],
    "documentation": [
        ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
    ],
    "shared": [ipaddress.ip_network("100.64.0.0/10")],  # carrier-grade NAT
    # Special-purpose IPv4 blocks (RFC 6890) that ipaddress.is_reserved leaves out:
    # "this network", IETF protocol assignments, 6to4 relay anycast, benchmarking.
    "reserved": [ipaddress.ip_network(n) for n in ("0.0.0.0/8", "192.0.0.0/24", "192.88.99.0/24", "198.18.0.0/15")],
}


class PiiConfig(StrictModel):
    """What to redact, the placeholders, and which addresses are harmless enough to keep."""

    emails: bool = True
    ip_addresses: bool = True
    ipv6: bool = True
    email_replacement: str = "<EMAIL>"
    ip_replacement: str = "<IP_ADDRESS>"
    keep_ip_kinds: list[IpKind] = Field(default_factory=lambda: list(ALL_IP_KINDS))
    # E-mail at these domains (and their sub-domains) is kept: RFC 2606/6761 reserved names.
    keep_email_domains: list[str] = Field(
        default_factory=lambda: ["example.com", "example.org", "example.net", "example", "test", "invalid", "localhost"]
    )
    # Skip dotted quads right after "version", "release", ... (e.g. "version 1.2.0.4").
    skip_version_context: bool = True


# Local part and domain are matched around each "@" separately, so a long run of word
# characters without an "@" costs nothing (a single regex would backtrack over it).
_LOCAL_TAIL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,64}$")
_DOMAIN_HEAD = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![A-Za-z0-9-])")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
# Not part of a longer dotted run (1.2.3.4.5, 999.1.1.1) nor of a word (v1.2.3.4).
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w]|\.\w)")
# A necessary part of every _IPV4 match, in RE2 for pyarrow (ASCII digits, like _OCTET).
_IPV4_NEEDS = r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]"
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:]|\.\w)")
# A dotted quad right after one of these words is a version or section number, not an address:
# "version 1.2.0.4", '__version__ = "0.5.1.2"', 'sections "8.2.4.44'.
_VERSION_BEFORE = re.compile(
    r"(?i)(?<![a-z])(?:version|ver|release|build|section|sections|sect|rfc|spec|v)[_\s:=\"'(\[.#-]*$"
)


def ip_kinds(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> set[str]:
    """The non-public categories an address belongs to (empty for a public address)."""
    kinds = {name for name, nets in _NETWORKS.items() if any(addr in net for net in nets if net.version == addr.version)}
    for kind in ("loopback", "unspecified", "link_local", "multicast", "reserved"):
        if getattr(addr, f"is_{kind}"):
            kinds.add(kind)
    return kinds


def _email_spans(text: str, cfg: PiiConfig) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    keep = tuple(d.lower().lstrip(".") for d in cfg.keep_email_domains)
    at = text.find("@")
    last_end = 0
    while at != -1:
        local = _LOCAL_TAIL.search(text, max(last_end, at - 64), at)
        domain = _DOMAIN_HEAD.match(text, at + 1, min(len(text), at + 1 + 255))
        if local and domain:
            start = local.start()
            # A local part neither starts nor ends with a dot ("see.me@x" -> "me@x" is still an address).
            while start < at and text[start] == ".":
                start += 1
            host = domain.group(0).lower()
            if start < at and text[at - 1] != "." and not any(host == d or host.endswith("." + d) for d in keep):
                spans.append((start, domain.end()))
                last_end = domain.end()
        at = text.find("@", max(at + 1, last_end))
    return spans


def _is_version(text: str, start: int, cfg: PiiConfig) -> bool:
    return cfg.skip_version_context and _VERSION_BEFORE.search(text, max(0, start - 24), start) is not None


def _ip_spans(text: str, cfg: PiiConfig) -> list[tuple[int, int]]:
    keep = set(cfg.keep_ip_kinds)
    spans: list[tuple[int, int]] = []
    if "." in text:
        for m in _IPV4.finditer(text):
            if _is_version(text, m.start(), cfg):
                continue
            if not ip_kinds(ipaddress.IPv4Address(m.group(0))) & keep:
                spans.append(m.span())
    if cfg.ipv6 and ("::" in text or text.count(":") >= 7):
        for m in _IPV6.finditer(text):
            cand = m.group(0)
            # Three or more groups with hex digits: "a::b" and slices like "1::2" are not addresses.
            if sum(1 for g in cand.split(":") if g) < 3:
                continue
            try:
                addr = ipaddress.IPv6Address(cand)
            except ValueError:
                continue
            if not ip_kinds(addr) & keep:
                spans.append(m.span())
    return spans


def redact_text(text: str, cfg: PiiConfig) -> tuple[str, dict[str, int]]:
    """Replace e-mail addresses and public IPs in `text`; return the new text and counts per kind."""
    found: list[tuple[int, int, str]] = []
    if cfg.emails and "@" in text:
        found += [(s, e, "email") for s, e in _email_spans(text, cfg)]
    if cfg.ip_addresses:
        found += [(s, e, "ip_address") for s, e in _ip_spans(text, cfg)]
    if not found:
        return text, {}
    found.sort()
    replacement = {"email": cfg.email_replacement, "ip_address": cfg.ip_replacement}
    parts: list[str] = []
    counts: Counter = Counter()
    pos = 0
    for start, end, kind in found:
        if start < pos:  # an IP inside an already replaced e-mail (user@10.0.0.1 style)
            continue
        parts += [text[pos:start], replacement[kind]]
        counts[kind] += 1
        pos = end
    parts.append(text[pos:])
    return "".join(parts), dict(counts)


def pii_redact(in_path: Path, out_path: Path, cfg: PiiConfig) -> StageResult:
    """Redact every document of `in_path` into `out_path`; counts in == out, redactions in stats."""
    stats: Counter = Counter({"redacted_email": 0, "redacted_ip_address": 0, "docs_redacted": 0})
    pf = pq.ParquetFile(in_path)
    with DataStep(STAGE, out_path) as step:
        for batch in iter_batches(pf, BATCH_ROWS, columns=DOCUMENT_SCHEMA.names):
            batch = batch.cast(DOCUMENT_SCHEMA)
            step.read(batch)
            texts = batch.column("text")
            need = _may_hold_pii(texts, cfg)  # the rest cannot match: they pass through as they are
            if pc.any(need).as_py():
                rows = pa.array(np.flatnonzero(need.to_numpy(zero_copy_only=False)))
                sources = batch.column("source").take(rows).to_pylist()
                new = [_redact_counted(t, src, cfg, stats) for src, t in zip(sources, texts.take(rows).to_pylist())]
                texts = pc.replace_with_mask(texts, need, pa.array(new, pa.string()))
                batch = batch.set_column(DOCUMENT_SCHEMA.get_field_index("text"), DOCUMENT_SCHEMA.field("text"), texts)
            step.keep(batch)
    return step.result(dict(sorted(stats.items())))


def _may_hold_pii(texts: pa.Array, cfg: PiiConfig) -> pa.Array:
    """Texts in which `redact_text` could find something, by necessary conditions checked in
    pyarrow kernels over the batch: an "@" for an e-mail; a dotted run of four digit groups for
    IPv4 (every `_IPV4` match holds one); the IPv6 test `_ip_spans` itself makes first."""
    false = pa.array(np.zeros(len(texts), dtype=bool))
    need = pc.match_substring(texts, "@") if cfg.emails else false
    if cfg.ip_addresses:
        need = pc.or_(need, pc.match_substring_regex(texts, _IPV4_NEEDS))
        if cfg.ipv6:
            v6 = pc.or_(pc.match_substring(texts, "::"), pc.greater_equal(pc.count_substring(texts, ":"), 7))
            need = pc.or_(need, v6)
    return pc.fill_null(need, False)


def _redact_counted(text: str, source: str, cfg: PiiConfig, stats: Counter) -> str:
    """`text` redacted, with its redactions added to `stats` (in total and per source)."""
    new, counts = redact_text(text, cfg)
    if counts:
        stats["docs_redacted"] += 1
        for kind, n in counts.items():
            stats[f"redacted_{kind}"] += n
            stats[f"redacted_{kind}:{source}"] += n
    return new


class PiiRedact(Stage):
    """E-mail addresses and IP addresses masked: work/data/pii/<key>/docs.parquet."""

    name, store, Config, Result = STAGE, "data/pii", PiiConfig, StageResult
    inputs = ("docs",)

    def compute(self, inputs: dict, out_dir: Path) -> StageResult:
        return pii_redact(inputs["docs"], out_dir / "docs.parquet", self.config)
