"""`gatehouse bench tls`, the handshake load generator, against real servers."""

import re
import subprocess

import pytest

from harness import BIN, free_port, make_cert
from test_keyops import config, needs_ifma

RESULT = re.compile(r"^tls handshakes_per_sec=(\d+) p50_ms=([\d.]+) p99_ms=([\d.]+) errors=(\d+)$")


def bench_tls(port, *args, timeout=120, path="/"):
    p = subprocess.run([str(BIN), "bench", "tls", f"https://a.test:{port}{path}", "--connect", f"127.0.0.1:{port}", *args],
                       capture_output=True, text=True, timeout=timeout)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    m = RESULT.match(last)
    assert m, f"no result line\nstdout: {p.stdout}\nstderr: {p.stderr}"
    rate, p50, p99, errors = int(m[1]), float(m[2]), float(m[3]), int(m[4])
    return p.returncode, rate, p50, p99, errors, p.stderr


@needs_ifma
@pytest.mark.parametrize("tls", [["--tls", "1.3"], ["--tls", "1.2", "--ciphers", "ECDHE-RSA-AES256-GCM-SHA384"]],
                         ids=["tls1.3", "tls1.2"])
def test_2000_concurrent_handshakes_against_mb_complete_without_error(tmp_path, gatehouse, tls):
    port = free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="rsa:2048")
    gatehouse(config(port, "k", crt, key, provider="mb"), [port]).wait_log("RSA-2048 key on mb")
    rc, rate, p50, p99, errors, err = bench_tls(port, "-c", "2000", "-n", "2000", "--timeout", "60", *tls)
    assert (rc, errors) == (0, 0), err
    assert "2000 handshakes in" in err, err
    assert rate > 0 and 0 < p50 <= p99, err
    want = "TLSv1.3" if tls[1] == "1.3" else "TLSv1.2 ECDHE-RSA-AES256-GCM-SHA384"
    assert f"negotiated {want}" in err, err


@needs_ifma
def test_a_faulty_ecdsa_lane_fails_only_its_own_handshake(tmp_path, gatehouse, monkeypatch):
    # ECDSA signatures on mb take presignatures made in rows of eight
    # lanes. Every signature whose nonce came from lane 0 of its row is
    # corrupted; its check refuses it, and only that handshake fails. The
    # pool is taken oldest first, lane 0 first in each row, and the
    # presignatures left in it signed nothing: up to five rows' worth (at
    # most one row left when an idle moment makes four more).
    monkeypatch.setenv("GATEHOUSE_TEST_FAULT_LANE", "0")
    port, admin = free_port(), free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="ec")
    g = gatehouse(config(port, "k", crt, key, provider="mb", extra=f"admin: {{ address: 127.0.0.1:{admin} }}"),
                  [port, admin])
    g.wait_log("ECDSA P-256 key on mb")
    rc, rate, p50, p99, errors, err = bench_tls(port, "-c", "64", "-n", "3000", "--timeout", "60", "--tls", "1.3")
    from test_keyops import metrics
    fams = metrics(admin)
    batches = sum(s.value for s in fams["gatehouse_keyops_batches"].samples if s.labels.get("key") == "ecdsa-p256")
    assert batches > 0, "signatures take presignatures made in lane batches"
    assert 0 < errors <= batches <= errors + 5, (errors, batches, err)
    g.wait_log("ECDSA lane failed its checks")


def test_a_run_for_a_duration_reports_latency_and_client_cost(tmp_path, gatehouse):
    port = free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="ec")
    gatehouse(config(port, "k", crt, key, provider="boring"), [port])
    rc, rate, p50, p99, errors, err = bench_tls(port, "-c", "4", "-d", "1.5")
    assert (rc, errors) == (0, 0), err
    assert rate > 10, err
    assert "client CPU per handshake" in err, err
    # Every connection was a full handshake: none resumed, each a new TCP connection.
    assert "negotiated TLSv1.3" in err, err


def test_errors_are_counted_by_kind_and_fail_the_run(tmp_path, gatehouse):
    port = free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="ec")
    cfg = config(port, "k", crt, key, provider="boring").replace("status: 200", "status: 503")
    gatehouse(cfg, [port])
    rc, rate, _, _, errors, err = bench_tls(port, "-c", "2", "-n", "10")
    assert rc == 1 and errors == 10 and rate == 0, err
    assert "error status: 10 (first: status 503)" in err, err
    # A TLS version the server refuses: handshake errors.
    g2 = free_port()
    gatehouse(config(g2, "k", crt, key, provider="boring", tls="{ min_version: '1.3' }"), [g2])
    rc, _, _, _, errors, err = bench_tls(g2, "-n", "3", "--tls", "1.2")
    assert rc == 1 and errors == 3 and "error handshake: 3" in err, err


def test_bad_arguments_are_refused_with_a_clear_message():
    for args, msg in ((["http://x/"], "expected a URL starting with https://"),
                      (["https://127.0.0.1:1/", "-n", "1"], "error connect: 1"),
                      (["https://127.0.0.1:9/", "--connect", "127.0.0.1:9", "--tls", "1.1"], "--tls 1.1: expected 1.2 or 1.3")):
        p = subprocess.run([str(BIN), "bench", "tls", *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 1 and msg in p.stderr, p.stderr
