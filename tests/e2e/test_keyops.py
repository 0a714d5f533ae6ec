"""Batched private-key offload (key_provider: mb) through real TLS clients."""

import concurrent.futures
import urllib.request
import ssl
from pathlib import Path

import pytest

from harness import curl, free_port, make_cert, raw_request
from test_tls import s_client

IFMA = "avx512ifma" in Path("/proc/cpuinfo").read_text()
needs_ifma = pytest.mark.skipif(not IFMA, reason="CPU without AVX-512 IFMA: mb is refused")


def config(port, name, crt, key, provider="mb", extra="", tls="{}"):
    return f"""
access_log: {{ path: off }}
workers: 1
{extra}
listeners:
  - name: https
    address: 127.0.0.1:{port}
    protocol: https
    tls: {tls}
certificates:
  - {{ name: {name}, cert: {crt}, key: {key}, sni: [a.test], key_provider: {provider} }}
routes:
  - name: hello
    direct_response: {{ status: 200, body: "hello\\n" }}
"""


@needs_ifma
@pytest.mark.parametrize("kind", ["rsa:2048", "rsa:4096", "ec"])
def test_tls12_and_tls13_handshakes_with_mb(tmp_path, gatehouse, kind):
    port = free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind=kind)
    # Plain RSA key exchange is off by default; allow it so decryption runs.
    tls = "{}" if kind == "ec" else "{ ciphers: 'ECDHE-RSA-AES256-GCM-SHA384:AES256-GCM-SHA384' }"
    g = gatehouse(config(port, "k", crt, key, tls=tls), [port])
    if kind != "ec":
        bits = kind.split(":")[1]
        g.wait_log(f"RSA-{bits} key on mb")
    for flags in (["--tlsv1.2", "--tls-max", "1.2"], ["--tlsv1.3"]):
        code, body, err = curl("--cacert", str(crt), "--resolve", f"a.test:{port}:127.0.0.1", *flags, f"https://a.test:{port}/")
        assert (code, body) == (200, "hello\n"), err
    suites = ["ECDHE-ECDSA-AES256-GCM-SHA384"] if kind == "ec" else [
        "ECDHE-RSA-AES256-GCM-SHA384",
        "AES256-GCM-SHA384",  # RSA key exchange: the provider decrypts
    ]
    for suite in suites:
        out = s_client(port, "-tls1_2", "-cipher", suite, "-CAfile", str(crt), "-verify_return_error")
        assert f"Cipher is {suite}" in out, out
        assert "Verify return code: 0 (ok)" in out, out
    if kind != "ec":
        # Each RSA signature scheme: PKCS#1 v1.5 (TLS 1.2) and PSS (both).
        for version, sigalg in (("-tls1_2", "RSA+SHA256"), ("-tls1_2", "RSA+SHA512"),
                                ("-tls1_2", "rsa_pss_rsae_sha384"), ("-tls1_3", "rsa_pss_rsae_sha512")):
            out = s_client(port, version, "-sigalgs", sigalg, "-CAfile", str(crt), "-verify_return_error")
            assert "Verify return code: 0 (ok)" in out and "Cipher is (NONE)" not in out, out


def handshake(port, ca):
    """One full TLS handshake (certificate and signature verified) and one request."""
    return raw_request(port, b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
                       timeout=20, tls=True, server_name="a.test", cafile=ca)


@needs_ifma
def test_concurrent_handshakes_batch_and_all_succeed(tmp_path, gatehouse):
    port, admin = free_port(), free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="rsa:2048")
    gatehouse(config(port, "k", crt, key, extra=f"admin: {{ address: 127.0.0.1:{admin} }}"), [port, admin])
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(lambda _: handshake(port, crt), range(400)))
    assert all(r.startswith(b"HTTP/1.1 200") and r.endswith(b"hello\n") for r in results)
    # The batcher's counters account for every signature: batched or single.
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    batched = sum(int(s.labels["size"]) * s.value for s in families["gatehouse_keyops_batches"].samples
                  if s.labels.get("key") == "rsa2048")
    single = sum(s.value for s in families["gatehouse_keyops_single_ops"].samples if s.labels.get("key") == "rsa2048")
    assert batched + single == 400, (batched, single)
    assert batched > 0, "64 concurrent clients must fill some batches"
    delays = {s.name: s.value for s in families["gatehouse_keyops_queue_delay_seconds"].samples if s.name.endswith("_count")}
    assert delays["gatehouse_keyops_queue_delay_seconds_count"] == 400


@needs_ifma
def test_a_faulty_lane_fails_its_handshake_cleanly_and_the_rest_succeed(tmp_path, gatehouse, monkeypatch):
    monkeypatch.setenv("GATEHOUSE_TEST_FAULT_LANE", "0")
    port = free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="rsa:2048")
    g = gatehouse(config(port, "k", crt, key), [port])

    def attempt(_):
        try:
            return ("ok", handshake(port, crt))
        except ssl.SSLError as e:
            return ("tls-error", str(e))
        except OSError as e:
            return ("io-error", str(e))

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(attempt, range(400)))
    ok = [r for kind, r in results if kind == "ok"]
    failed = [r for kind, r in results if kind != "ok"]
    # Batches run on mb only from the break-even size up; each such batch loses
    # exactly its first lane. Every handshake that completed verified the
    # server's signature, so no wrong signature went out.
    assert failed, "the injected faults were caught"
    assert len(ok) > len(failed), (len(ok), failed[:3])
    assert all(r.startswith(b"HTTP/1.1 200") for r in ok)
    assert not any("BAD_SIGNATURE" in r.upper() or "DECRYPT" in r.upper() for r in failed), failed[:5]
    g.wait_log("failed the public-key check")
