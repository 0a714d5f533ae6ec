"""Batched private-key offload (key_provider: mb) through real TLS clients."""

import concurrent.futures
import json
import os
import socket
import subprocess
import urllib.request
import ssl
from pathlib import Path

import pytest

from harness import BIN, curl, free_port, make_cert, raw_request
from test_tls import s_client

IFMA = "avx512ifma" in Path("/proc/cpuinfo").read_text()
needs_ifma = pytest.mark.skipif(not IFMA, reason="CPU without AVX-512 IFMA: mb is refused")
without_ifma = pytest.mark.skipif(IFMA, reason="this CPU has AVX-512 IFMA: mb runs")


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


def concurrent_handshakes(tmp_path, gatehouse, kind, count, threads):
    """Gatehouse (mb, with an admin API) and `count` handshakes from
    `threads` clients at once, every one answered; returns the admin port."""
    port, admin = free_port(), free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind=kind)
    gatehouse(config(port, "k", crt, key, extra=f"admin: {{ address: 127.0.0.1:{admin} }}"), [port, admin])
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda _: handshake(port, crt), range(count)))
    assert all(r.startswith(b"HTTP/1.1 200") and r.endswith(b"hello\n") for r in results)
    return admin


@needs_ifma
def test_concurrent_handshakes_batch_and_all_succeed(tmp_path, gatehouse):
    admin = concurrent_handshakes(tmp_path, gatehouse, "rsa:2048", 400, 64)
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
    # Every queued operation: the 400 signatures and, on this CPU, the 400
    # X25519 key shares (Python's client offers X25519).
    assert delays["gatehouse_keyops_queue_delay_seconds_count"] == 800


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


def two_certificates(tmp_path, port, provider):
    """An ECDSA and an RSA certificate on one listener, by SNI."""
    ec_crt, ec_key = make_cert(tmp_path, "ec", ["ec.test"], kind="ec")
    rsa_crt, rsa_key = make_cert(tmp_path, "rsa", ["rsa.test"], kind="rsa:2048")
    cfg = config(port, "ec", ec_crt, ec_key, provider=provider)
    cfg = cfg.replace("certificates:\n", "certificates:\n"
                      f"  - {{ name: rsa, cert: {rsa_crt}, key: {rsa_key}, sni: [rsa.test], key_provider: {provider} }}\n")
    return cfg.replace("sni: [a.test]", "sni: [ec.test]"), ec_crt, rsa_crt


@without_ifma
def test_without_ifma_auto_says_it_uses_boringssl_and_every_handshake_works(tmp_path, gatehouse):
    port = free_port()
    cfg, ec_crt, rsa_crt = two_certificates(tmp_path, port, "auto")
    g = gatehouse(cfg, [port])
    for kind in ("ECDSA", "RSA"):
        g.wait_log(f"{kind} key on BoringSSL, one operation at a time (key_provider auto: this CPU has no AVX-512 IFMA)")
    # The post-quantum share's ML-KEM half in the AVX2 kernels instead.
    g.wait_log("X25519MLKEM768 key shares: ML-KEM-768 in Gatehouse's vector kernels, X25519 in BoringSSL")
    for name, crt in (("ec.test", ec_crt), ("rsa.test", rsa_crt)):
        for flags in (["--tlsv1.2", "--tls-max", "1.2"], ["--tlsv1.3"]):
            code, body, err = curl("--cacert", str(crt), "--resolve", f"{name}:{port}:127.0.0.1", *flags,
                                   f"https://{name}:{port}/")
            assert (code, body) == (200, "hello\n"), (name, flags, err)
        # Go's client checks the server's Finished: a wrong secret fails here.
        group, answer = go_request(tmp_path, port, crt, name)
        assert (group, answer.endswith("hello\n")) == ("X25519MLKEM768", True), answer


@without_ifma
def test_without_ifma_mb_is_a_config_error_naming_the_field(tmp_path, gatehouse):
    port = free_port()
    cfg, _, _ = two_certificates(tmp_path, port, "mb")
    path = tmp_path / "mb.yaml"
    path.write_text(cfg)
    p = subprocess.run([str(BIN), "check", "-c", str(path)], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    # Both certificates are named, each at its own field path.
    for i in (0, 1):
        assert f"certificates[{i}].key_provider" in p.stderr + p.stdout, p.stderr
    assert "needs AVX-512 IFMA" in p.stderr + p.stdout


GO_CLIENT = """package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
)

// One HTTPS request with Go's default TLS settings (X25519MLKEM768 offered
// first since Go 1.24); prints the group the handshake used, then the answer.
func main() {
	pem, err := os.ReadFile(os.Args[2])
	if err != nil {
		panic(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	conn, err := tls.Dial("tcp", os.Args[1], &tls.Config{RootCAs: pool, ServerName: os.Args[3]})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(conn, "GET / HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n", os.Args[3])
	body, _ := io.ReadAll(conn)
	fmt.Println(conn.ConnectionState().CurveID.String())
	os.Stdout.Write(body)
}
"""


def go_request(tmp_path, port, ca, name):
    src = tmp_path / "goclient" / "main.go"
    src.parent.mkdir(exist_ok=True)
    src.write_text(GO_CLIENT)
    p = subprocess.run(["go", "run", str(src), f"127.0.0.1:{port}", str(ca), name],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "GOFLAGS": "-mod=mod"})
    assert p.returncode == 0, p.stderr
    group, _, answer = p.stdout.partition("\n")
    return group, answer


def test_every_handshake_counts_its_key_share_by_group(tmp_path, gatehouse):
    port, admin = free_port(), free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="ec")
    gatehouse(config(port, "k", crt, key, provider="auto", extra=f"admin: {{ address: 127.0.0.1:{admin} }}"),
              [port, admin])
    code, body, err = curl("--curves", "X25519", "--cacert", str(crt), "--resolve", f"a.test:{port}:127.0.0.1",
                           "--tlsv1.3", f"https://a.test:{port}/")
    assert (code, body) == (200, "hello\n"), err
    # TLS 1.2 ECDHE-ECDSA must offer the certificate's curve (RFC 4492, as
    # BoringSSL holds it): P-256 here.
    for args, temp_key in ((["-tls1_2", "-groups", "P-256"], "prime256v1"), (["-tls1_3", "-groups", "P-384"], "secp384r1")):
        out = s_client(port, *args, "-CAfile", str(crt), "-verify_return_error")
        assert f"Server Temp Key: ECDH, {temp_key}" in out and "Cipher is (NONE)" not in out, out
    group, answer = go_request(tmp_path, port, crt, "a.test")
    assert answer.startswith("HTTP/1.1 200") and answer.endswith("hello\n"), answer
    assert group == "X25519MLKEM768", f"Go offers X25519MLKEM768 first and Gatehouse takes it, not {group}"
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    shares = {}
    for sample in families["gatehouse_tls_key_shares"].samples:
        if sample.value:
            shares[(sample.labels["group"], sample.labels["engine"])] = sample.value
    # auto: on a CPU with IFMA the X25519-based TLS 1.3 shares come from
    # the lanes (through BoringSSL's handshake hints); without, the
    # X25519MLKEM768 share from the ML-KEM kernels (AVX2) and BoringSSL's
    # X25519; the rest from BoringSSL.
    lanes, pq = ("mb", "mb") if IFMA else ("boring", "simd")
    assert shares == {("X25519", lanes): 1, ("X25519MLKEM768", pq): 1, ("P-256", "boring"): 1,
                      ("P-384", "boring"): 1}, shares


def metrics(admin):
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def lane_shares(families):
    """Key shares the lanes computed, by group."""
    return {s.labels["group"]: s.value for s in families["gatehouse_tls_key_shares"].samples
            if s.labels["engine"] == "mb" and s.value}


def lane_batches(families, key, size=None):
    return sum(s.value for s in families["gatehouse_keyops_batches"].samples
               if s.labels.get("key") == key and (size is None or s.labels["size"] == str(size)))


def x25519_batches(families, size=None):
    return lane_batches(families, "x25519", size)


@needs_ifma
def test_key_shares_in_lanes_for_every_kind_of_client(tmp_path, gatehouse):
    port, admin = free_port(), free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="ec")
    g = gatehouse(config(port, "k", crt, key, extra=f"admin: {{ address: 127.0.0.1:{admin} }}"), [port, admin])
    g.wait_log("key shares in AVX-512 IFMA lanes")
    # Go's crypto/tls: X25519MLKEM768, its X25519 half in IFMA lanes and its
    # ML-KEM half in Keccak lanes; the client checks the server's Finished,
    # so a wrong secret would fail here.
    group, answer = go_request(tmp_path, port, crt, "a.test")
    assert (group, answer.endswith("hello\n")) == ("X25519MLKEM768", True), answer
    # curl (OpenSSL) with X25519; an OpenSSL client offering only P-256
    # (BoringSSL's own); and TLS 1.2 ECDHE-ECDSA over X25519, whose server
    # key pair was made ahead in the lanes (the shared secret is BoringSSL's;
    # a wrong pair would fail the client's Finished).
    code, body, err = curl("--curves", "X25519", "--cacert", str(crt), "--resolve", f"a.test:{port}:127.0.0.1",
                           "--tlsv1.3", f"https://a.test:{port}/")
    assert (code, body) == (200, "hello\n"), err
    out = s_client(port, "-tls1_3", "-groups", "P-256", "-CAfile", str(crt), "-verify_return_error")
    assert "Server Temp Key: ECDH, prime256v1" in out and "Verify return code: 0 (ok)" in out, out
    out = s_client(port, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384", "-CAfile", str(crt),
                   "-verify_return_error")
    assert "Cipher is ECDHE-ECDSA-AES256-GCM-SHA384" in out and "Server Temp Key: X25519" in out, out
    assert "Verify return code: 0 (ok)" in out, out
    # A client whose X25519 share is refused by the server's preference
    # (it lists X25519MLKEM768 but sends only X25519): BoringSSL asks again.
    out = s_client(port, "-tls1_3", "-groups", "X25519:P-256", "-CAfile", str(crt), "-verify_return_error")
    assert "Server Temp Key: X25519" in out and "Verify return code: 0 (ok)" in out, out
    fams = metrics(admin)
    assert lane_shares(fams) == {"X25519MLKEM768": 1, "X25519": 3}, lane_shares(fams)
    assert x25519_batches(fams) >= 2, "the shares' batches and the TLS 1.2 key pairs' comb"
    assert lane_batches(fams, "mlkem768", 1) == 1, "one ML-KEM-768 encapsulation, in lanes"


@needs_ifma
def test_concurrent_post_quantum_handshakes_share_their_ml_kem_batches(tmp_path, gatehouse):
    # 32 Go crypto/tls clients in a loop, each checking the server's
    # Finished: ML-KEM-768 encapsulations run several to a batch of lanes,
    # and every handshake's secret is right.
    port, admin = free_port(), free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="ec")
    gatehouse(config(port, "k", crt, key, extra=f"admin: {{ address: 127.0.0.1:{admin} }}"), [port, admin])
    h3load = BIN.parent.parent / "h3load"
    p = subprocess.run([str(h3load), "-tcp", "-handshake", "-c", "32", "-d", "3s", "-addr", f"127.0.0.1:{port}",
                        "-host", "a.test", "-ca", str(crt), "-curve", "x25519mlkem768"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["errors"] == 0 and summary["handshakes"] >= 100, summary
    fams = metrics(admin)
    assert lane_shares(fams).get("X25519MLKEM768", 0) >= summary["handshakes"], lane_shares(fams)
    encapsulated = sum(int(s.labels["size"]) * s.value for s in fams["gatehouse_keyops_batches"].samples
                       if s.labels.get("key") == "mlkem768")
    assert encapsulated == lane_shares(fams)["X25519MLKEM768"]
    assert sum(lane_batches(fams, "mlkem768", n) for n in (2, 3, 4)) > 0, "no batch of more than one"


def pq_client_hello(mlkem_key, name=b"a.test"):
    """A TLS 1.3 ClientHello offering only X25519MLKEM768, with this
    ML-KEM-768 key (1184 bytes) and a fixed X25519 point as its share."""
    def ext(kind, body):
        return kind.to_bytes(2, "big") + len(body).to_bytes(2, "big") + body

    share = mlkem_key + bytes([9] + [0] * 31)
    key_share = (0x11ec).to_bytes(2, "big") + len(share).to_bytes(2, "big") + share
    sni = b"\x00" + len(name).to_bytes(2, "big") + name
    exts = b"".join([
        ext(0x0000, (len(sni)).to_bytes(2, "big") + sni),
        ext(0x002b, b"\x02\x03\x04"),
        ext(0x000a, b"\x00\x02\x11\xec"),
        ext(0x000d, b"\x00\x02\x04\x03"),
        ext(0x0033, len(key_share).to_bytes(2, "big") + key_share),
    ])
    body = (b"\x03\x03" + os.urandom(32) + b"\x20" + os.urandom(32) + b"\x00\x02\x13\x01" + b"\x01\x00"
            + len(exts).to_bytes(2, "big") + exts)
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(hs).to_bytes(2, "big") + hs


def first_record(port, hello):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(hello)
        head = b""
        while len(head) < 7:
            chunk = s.recv(7 - len(head))
            if not chunk:
                break
            head += chunk
        return head


def test_a_malformed_ml_kem_key_share_is_refused_with_an_alert(tmp_path, gatehouse):
    # FIPS 203's check of the client's key: a coefficient of 4095 is no
    # key. The lanes (or without IFMA, the AVX2 kernels) leave it to
    # BoringSSL, which answers with a fatal alert; a well-formed key (all
    # coefficients zero) gets a ServerHello, and the server goes on serving.
    port, admin = free_port(), free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="ec")
    gatehouse(config(port, "k", crt, key, provider="auto", extra=f"admin: {{ address: 127.0.0.1:{admin} }}"), [port, admin])
    good = bytes(1152) + bytes(range(32))
    bad = b"\xff\x0f" + good[2:]
    head = first_record(port, pq_client_hello(bad))
    assert head[:1] == b"\x15" and head[5:6] == b"\x02" and head[6] in (47, 50), head.hex()
    head = first_record(port, pq_client_hello(good))
    assert head[:1] == b"\x16" and head[5:6] == b"\x02", head.hex()  # a ServerHello
    code, body, err = curl("--cacert", str(crt), "--resolve", f"a.test:{port}:127.0.0.1", f"https://a.test:{port}/")
    assert (code, body) == (200, "hello\n"), err
    if IFMA:
        assert lane_batches(metrics(admin), "mlkem768") == 2, "both keys went to the lanes"


@needs_ifma
def test_two_thousand_concurrent_handshakes_with_lane_key_shares(tmp_path, gatehouse):
    fams = metrics(concurrent_handshakes(tmp_path, gatehouse, "ec", 2000, 128))
    assert lane_shares(fams) == {"X25519": 2000}, lane_shares(fams)
    # Every share took two lanes of some batch.
    lanes = sum(int(s.labels["size"]) * s.value for s in fams["gatehouse_keyops_batches"].samples
                if s.labels.get("key") == "x25519")
    assert lanes == 4000
    # Every ECDSA signature took a presignature made in a full batch of
    # lanes; what is left over waits in the worker's pool (up to forty:
    # eight left when an idle moment makes four rows of eight more).
    # None ran alone in BoringSSL.
    sizes = {int(s.labels["size"]): s.value for s in fams["gatehouse_keyops_batches"].samples
             if s.labels.get("key") == "ecdsa-p256" and s.value}
    single = sum(s.value for s in fams["gatehouse_keyops_single_ops"].samples if s.labels.get("key") == "ecdsa-p256")
    assert list(sizes) == [8] and single == 0, (sizes, single)
    assert 2000 <= 8 * sizes[8] <= 2000 + 40, sizes


@needs_ifma
def test_a_faulty_key_share_lane_fails_only_its_own_handshake(tmp_path, gatehouse, monkeypatch):
    # The fourth share of each batch: only batches of four shares or more
    # (8 lanes and up) lose one.
    monkeypatch.setenv("GATEHOUSE_TEST_FAULT_SHARE", "3")
    port, admin = free_port(), free_port()
    crt, key = make_cert(tmp_path, "k", ["a.test"], kind="ec")
    gatehouse(config(port, "k", crt, key, extra=f"admin: {{ address: 127.0.0.1:{admin} }}"), [port, admin])
    # One at a time: batches of one share, untouched.
    for _ in range(5):
        assert handshake(port, crt).startswith(b"HTTP/1.1 200")

    def attempt(_):
        try:
            return ("ok", handshake(port, crt))
        except (ssl.SSLError, OSError) as e:
            return ("error", str(e))

    # Rounds of 400 from 64 threads until some batch has filled (Python's
    # clients are slow to start: a round may find every batch short).
    results = []
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        for _ in range(5):
            results += pool.map(attempt, range(400))
            if any(kind != "ok" for kind, _ in results):
                break
    ok = [r for kind, r in results if kind == "ok"]
    failed = [r for kind, r in results if kind != "ok"]
    assert all(r.startswith(b"HTTP/1.1 200") for r in ok)
    # Exactly one handshake per batch of four shares or more failed: the
    # faulty lane's.
    fams = metrics(admin)
    assert len(failed) == sum(x25519_batches(fams, size=n) for n in range(8, 17, 2)), failed[:3]
    assert failed, "64 concurrent clients fill some batches"
    assert all("BAD_RECORD_MAC" in f.upper() or "DECRYPT" in f.upper() for f in failed), failed[:3]
