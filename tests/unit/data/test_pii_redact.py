"""PII redaction: e-mails and public IPs replaced and counted, harmless look-alikes kept."""
from __future__ import annotations

import time

import pyarrow.parquet as pq
import pytest

from tasks.data.documents import Document, documents_table
from tasks.data.pii_redact import PiiConfig, pii_redact, redact_text
from tests.helpers.parquet import write_table_atomic

CFG = PiiConfig()


@pytest.mark.parametrize(
    "text, expected, counts",
    [
        ("write to guido@python.org today", "write to <EMAIL> today", {"email": 1}),
        ("a.b+tag@mail.sub.example.co.uk.", "<EMAIL>.", {"email": 1}),
        ('__author__ = "Ben <ben@company.io>"', '__author__ = "Ben <<EMAIL>>"', {"email": 1}),
        ('to = ["one@one.org","two@two.org"]', 'to = ["<EMAIL>","<EMAIL>"]', {"email": 2}),
        ("server at 8.8.8.8.", "server at <IP_ADDRESS>.", {"ip_address": 1}),
        ("connect('93.184.216.34', 80)", "connect('<IP_ADDRESS>', 80)", {"ip_address": 1}),
        ("dns=1.1.1.1:53", "dns=<IP_ADDRESS>:53", {"ip_address": 1}),
        ("v6 host 2606:4700:4700::1111 up", "v6 host <IP_ADDRESS> up", {"ip_address": 1}),
        ("mail ops@corp.net from 8.8.4.4", "mail <EMAIL> from <IP_ADDRESS>", {"email": 1, "ip_address": 1}),
    ],
)
def test_redacts_and_counts(text, expected, counts):
    assert redact_text(text, CFG) == (expected, counts)


@pytest.mark.parametrize(
    "text",
    [
        "see user@example.com and x@test.example.org",  # RFC 2606 example domains
        "bind 127.0.0.1 or 0.0.0.0 or 10.1.2.3 or 192.168.0.1 or 172.16.5.4",  # loopback, private
        "docs use 192.0.2.1, 198.51.100.7 and 203.0.113.9",  # documentation ranges
        "multicast 224.0.0.1, link-local 169.254.1.1, broadcast 255.255.255.255, ::1, fe80::1",
        "release 1.2.3.4.5 and 10.20.30.40.50",  # longer dotted runs are not addresses
        "999.1.1.1 and 1.2.3.256 and 01.02.03.04",  # invalid octets
        "version 2.7.2.2 and __version__ = '0.5.1.2' and v1.2.3.4",  # version numbers
        "the HTML spec sections \"8.2.4.44\"",
        "@property\ndef f(self): return a@b",  # decorators and matrix products
        "x = w@v.T; y = m[1::2]; t = '12:34:56'; mac 00:1a:2b:3c:4d:5e",
        "user@localhost or admin@10.0.0.1",
        "",
    ],
)
def test_harmless_look_alikes_are_kept(text):
    assert redact_text(text, CFG) == (text, {})


def test_config_switches_and_kinds():
    text = "mail a@corp.org at 8.8.8.8 via 10.0.0.1"
    assert redact_text(text, PiiConfig(emails=False))[0] == "mail a@corp.org at <IP_ADDRESS> via 10.0.0.1"
    assert redact_text(text, PiiConfig(ip_addresses=False))[0] == "mail <EMAIL> at 8.8.8.8 via 10.0.0.1"
    strict = PiiConfig(keep_ip_kinds=["loopback"], email_replacement="[email]", ip_replacement="[ip]")
    assert redact_text(text + " 127.0.0.1", strict)[0] == "mail [email] at [ip] via [ip] 127.0.0.1"
    assert redact_text("see x@example.com", PiiConfig(keep_email_domains=[]))[0] == "see <EMAIL>"
    assert redact_text("version 1.2.3.4", PiiConfig(skip_version_context=False))[0] == "version <IP_ADDRESS>"
    assert redact_text("2606:4700::1111", PiiConfig(ipv6=False))[1] == {}


def test_bad_config_is_rejected():
    with pytest.raises(Exception, match="keep_ip_kinds"):
        PiiConfig(keep_ip_kinds=["everything"])
    with pytest.raises(Exception, match="emials"):
        PiiConfig.model_validate({"emials": True})


def test_hostile_inputs_stay_linear():
    hostile = [
        "a" * 200_000 + "@",  # long local part with no domain
        "@" * 100_000,
        "x@" * 50_000,
        "1." * 100_000,
        ("a" * 60 + "@" + "b" * 60 + ".") * 2_000,
        ":" * 100_000 + "1",
    ]
    start = time.perf_counter()
    for text in hostile:
        redact_text(text, CFG)
    assert time.perf_counter() - start < 5.0


def test_stage_conserves_documents_and_counts_per_source(tmp_path):
    docs = [
        Document(doc_id="a-0", source="a", text="contact me at jane@corp.org or 8.8.8.8", path="p", locator="row:0"),
        Document(doc_id="a-1", source="a", text="nothing to see here", path="p", locator="row:1"),
        Document(doc_id="b-0", source="b", text="# Author: Bob <bob@mail.net>\nHOST = '127.0.0.1'", path="q"),
    ]
    src = write_table_atomic(documents_table(docs), tmp_path / "in.parquet")
    res = pii_redact(src, tmp_path / "out.parquet", CFG)
    res.check_conservation()
    assert res.stage == "pii" and res.removed is None
    assert res.counts == {"a": {"in": 2, "out": 2}, "b": {"in": 1, "out": 1}}
    assert res.stats["redacted_email"] == 2 and res.stats["redacted_ip_address"] == 1
    assert res.stats["redacted_email:a"] == 1 and res.stats["redacted_email:b"] == 1
    assert res.stats["redacted_ip_address:a"] == 1 and "redacted_ip_address:b" not in res.stats
    assert res.stats["docs_redacted"] == 2
    out = pq.read_table(res.output).to_pylist()
    assert [d["doc_id"] for d in out] == ["a-0", "a-1", "b-0"]
    assert out[0]["text"] == "contact me at <EMAIL> or <IP_ADDRESS>"
    assert out[2]["text"] == "# Author: Bob <<EMAIL>>\nHOST = '127.0.0.1'"
    assert out[0]["path"] == "p" and out[0]["locator"] == "row:0"


def test_stage_on_empty_input(tmp_path):
    src = write_table_atomic(documents_table([]), tmp_path / "in.parquet")
    res = pii_redact(src, tmp_path / "out.parquet", CFG)
    assert res.counts == {} and pq.read_table(res.output).num_rows == 0


@pytest.mark.parametrize("cfg", [PiiConfig(), PiiConfig(emails=False), PiiConfig(ipv6=False)])
def test_stage_prefilter_changes_nothing_redact_text_would_not(tmp_path, cfg):
    """The stage sends only texts that may hold PII to redact_text; its output must equal
    redact_text on every text."""
    import random

    rng = random.Random(0)
    pieces = ["mail bob@example.org now", "host 8.8.8.8 up", "at 10.0.0.1", "v1.2.3.4", "ver 1.2.3.4",
              "2001:4860:4860::8888", "a::b", "1:2:3:4:5:6:7:8", "١٢.٣.٤.٥", "3.14159", "x@y", "plain words",
              "1.2.3.4.5", "addr 203.0.113.7.", "::", "a:b:c:d:e:f:g:h", "\u00e9t\u00e9 9.9.9.9"]
    texts = [" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(300)]
    docs = [Document(doc_id=f"d{i}", source="web", text=t, licence="x", path="p", locator=str(i)) for i, t in enumerate(texts)]
    src = write_table_atomic(documents_table(docs), tmp_path / "in.parquet")
    res = pii_redact(src, tmp_path / "out.parquet", cfg)
    out = pq.read_table(res.output).column("text").to_pylist()
    assert out == [redact_text(t, cfg)[0] for t in texts]
    assert out != texts  # the corpus holds PII this config redacts
