"""HTTP/2 conformance with h2spec against the HTTPS listener.

Every case must pass, except those listed in h2spec_known_failures.txt, each
with its reason; a case that starts passing must be removed from the list.
Case ids are `group/section/number`, e.g. `http2/3.5/2`.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import free_port

KNOWN = Path(__file__).with_name("h2spec_known_failures.txt")
GROUPS = {"Generic tests": "generic", "Hypertext Transfer Protocol": "http2", "HPACK": "hpack"}


def h2spec_binary():
    gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True).stdout.strip() or "/root/go"
    for cand in (shutil.which("h2spec"), os.path.join(gopath, "bin", "h2spec")):
        if cand and os.path.exists(cand):
            return cand
    return None


def known_failures():
    out = {}
    for line in KNOWN.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            case, _, reason = line.partition(" ")
            out[case] = reason.strip()
    return out


def parse_failures(report):
    """Case ids from the 'Failures:' part of h2spec's text report."""
    _, _, failures = report.partition("\nFailures:")
    group, section, out = "?", "?", set()
    for line in failures.splitlines():
        for title, short in GROUPS.items():
            if line.startswith(title):
                group = short
        m = re.match(r"^\s+(\d+(?:\.\d+)*)\. ", line)
        if m:
            section = m.group(1)
        m = re.match(r"^\s+× (\d+):", line)
        if m:
            out.add(f"{group}/{section}/{m.group(1)}")
    return out


def test_the_report_parser():
    sample = """
Failures:

Hypertext Transfer Protocol Version 2 (HTTP/2)
  3. Starting HTTP/2
    3.5. HTTP/2 Connection Preface
      × 2: Sends invalid connection preface
        -> The endpoint MUST terminate the TCP connection.

HPACK: Header Compression for HTTP/2
  6. Binary Format
    6.1. Indexed Header Field Representation
      × 1: Sends a indexed header field representation with index 0

Finished in 0.2 seconds
"""
    assert parse_failures(sample) == {"http2/3.5/2", "hpack/6.1/1"}


def test_h2spec(gatehouse, upstream):
    binary = h2spec_binary()
    if binary is None:
        pytest.skip("h2spec is not installed (scripts/install-deps.sh installs it)")
    up = upstream("a")
    port = free_port()
    gatehouse(
        f"""
access_log: {{ path: off }}
listeners: [{{ name: tls, address: 127.0.0.1:{port}, protocol: https }}]
certificates: [{{ name: local, self_signed: true, sni: [localhost] }}]
upstreams: [{{ name: a, endpoints: [{up.addr}] }}]
routes: [{{ name: a, upstream: a }}]
""",
        [port],
    )
    p = subprocess.run([binary, "-h", "127.0.0.1", "-p", str(port), "-t", "-k", "-o", "3"],
                       capture_output=True, text=True, timeout=600)
    report = p.stdout + p.stderr
    summary = re.search(r"(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed", report)
    assert summary, report[-3000:]
    failed = parse_failures(report)
    assert len(failed) == int(summary.group(4)), f"parsed {failed} from:\n{report[-3000:]}"
    known = known_failures()
    unexpected = sorted(failed - set(known))
    fixed = sorted(set(known) - failed)
    assert not unexpected, f"new h2spec failures: {unexpected}\n{summary.group(0)}\n{report[-3000:]}"
    assert not fixed, f"these now pass; remove them from {KNOWN.name}: {fixed}"
    assert int(summary.group(2)) >= 140, summary.group(0)
