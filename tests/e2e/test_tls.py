"""TLS termination: versions, SNI, ALPN, RSA/ECDSA choice, resumption."""

import subprocess

from harness import curl, free_port, make_cert


def config(port, certs, tls_extra=""):
    cert_yaml = "\n".join(
        f"  - {{ name: {n}, cert: {c}, key: {k}, sni: [{', '.join(s)}] }}" for n, c, k, s in certs
    )
    return f"""
access_log: {{ path: off }}
listeners:
  - name: https
    address: 127.0.0.1:{port}
    protocol: https
    tls: {{ default_certificate: {certs[0][0]} {tls_extra} }}
certificates:
{cert_yaml}
routes:
  - name: hello
    direct_response: {{ status: 200, body: "hello\\n" }}
"""


def s_client(port, *args, servername="a.test"):
    p = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", servername, *args],
        input=b"", capture_output=True, timeout=20,
    )
    return p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")


def subject_cn(port, servername, *args):
    out = s_client(port, *args, servername=servername)
    for line in out.splitlines():
        if line.startswith("subject="):
            return line.split("CN", 1)[1].strip(" =")
    raise AssertionError(out)


def test_sni_gives_each_name_its_certificate_over_tls12_and_tls13(tmp_path, gatehouse):
    port = free_port()
    a = make_cert(tmp_path, "a", ["a.test"])
    b = make_cert(tmp_path, "b", ["b.test", "*.b.test"], kind="rsa")
    gatehouse(config(port, [("a", *a, ["a.test"]), ("b", *b, ["b.test", "'*.b.test'"])]), [port])
    for version in ("-tls1_2", "-tls1_3"):
        assert subject_cn(port, "a.test", version) == "a.test"
        assert subject_cn(port, "b.test", version) == "b.test"
        assert subject_cn(port, "x.b.test", version) == "b.test", "wildcard"
        assert subject_cn(port, "unknown.test", version) == "a.test", "default certificate"
    for flags in (["--tlsv1.2", "--tls-max", "1.2"], ["--tlsv1.3"]):
        for host, want in (("a.test", "a.test"), ("b.test", "b.test")):
            code, body, err = curl(
                "--cacert", str(a[0] if want == "a.test" else b[0]),
                "--resolve", f"{host}:{port}:127.0.0.1", *flags, f"https://{host}:{port}/",
            )
            assert code == 200, err
            assert body == "hello\n"


def test_http2_is_negotiated_with_alpn(tmp_path, gatehouse):
    port = free_port()
    a = make_cert(tmp_path, "a", ["a.test"])
    gatehouse(config(port, [("a", *a, ["a.test"])]), [port])
    p = subprocess.run(
        ["curl", "-s", "--http2", "--cacert", str(a[0]), "--resolve", f"a.test:{port}:127.0.0.1",
         "-o", "/dev/null", "-w", "%{http_version} %{http_code}", f"https://a.test:{port}/"],
        capture_output=True, timeout=20,
    )
    assert p.stdout.decode() == "2 200"
    p = subprocess.run(
        ["curl", "-s", "--http1.1", "--cacert", str(a[0]), "--resolve", f"a.test:{port}:127.0.0.1",
         "-o", "/dev/null", "-w", "%{http_version} %{http_code}", f"https://a.test:{port}/"],
        capture_output=True, timeout=20,
    )
    assert p.stdout.decode() == "1.1 200"


def test_ecdsa_when_the_client_supports_it_else_rsa(tmp_path, gatehouse):
    port = free_port()
    ec = make_cert(tmp_path, "ec", ["site.test"], kind="ec")
    rsa = make_cert(tmp_path, "rsa", ["site.test"], kind="rsa")
    gatehouse(config(port, [("site-ec", *ec, ["site.test"]), ("site-rsa", *rsa, ["site.test"])]), [port])
    for version in ("-tls1_2", "-tls1_3"):
        out = s_client(port, version, servername="site.test")
        assert "Peer signature type: ECDSA" in out or "id-ecPublicKey" in out or "ECDSA" in out, out
        out = s_client(port, version, "-sigalgs", "RSA-PSS+SHA256:RSA+SHA256", servername="site.test")
        assert "Peer signature type: RSA" in out, out
    out = s_client(port, "-tls1_2", "-cipher", "ECDHE-RSA-AES256-GCM-SHA384", servername="site.test")
    assert "ECDHE-RSA-AES256-GCM-SHA384" in out


def test_minimum_version_and_cipher_list(tmp_path, gatehouse):
    port = free_port()
    a = make_cert(tmp_path, "a", ["a.test"])
    gatehouse(config(port, [("a", *a, ["a.test"])], ', min_version: "1.3"'), [port])
    out = s_client(port, "-tls1_2")
    assert "Cipher is (NONE)" in out or "alert" in out.lower(), out
    assert "TLSv1.3" in s_client(port, "-tls1_3")

    port3 = free_port()
    gatehouse(config(port3, [("a", *a, ["a.test"])], ', max_version: "1.2"'), [port3])
    assert "TLSv1.2" in s_client(port3)
    out = s_client(port3, "-tls1_3")
    assert "Cipher is (NONE)" in out or "alert" in out.lower(), out

    port2 = free_port()
    gatehouse(config(port2, [("a", *a, ["a.test"])], ", ciphers: ECDHE-ECDSA-AES256-GCM-SHA384"), [port2])
    out = s_client(port2, "-tls1_2")
    assert "ECDHE-ECDSA-AES256-GCM-SHA384" in out, out
    out = s_client(port2, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256")
    assert "Cipher is (NONE)" in out or "alert" in out.lower(), out


def cpu_has_aes():
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " aes " in f" {line.split(':', 1)[1]} " for line in f)


def negotiated(out):
    for line in out.splitlines():
        if "Cipher is " in line:
            return line.split("Cipher is ", 1)[1].strip()
    raise AssertionError(out)


def test_tls13_suites_are_chosen_as_go_chooses_them(tmp_path, gatehouse):
    """A client whose first TLS 1.3 choice is AES-GCM gets AES-128-GCM with
    SHA-256 (OpenSSL lists AES-256-GCM with SHA-384 first); one that puts
    ChaCha20-Poly1305 first keeps it; one that offers only AES-256-GCM gets
    it."""
    port = free_port()
    a = make_cert(tmp_path, "a", ["a.test"])
    gatehouse(config(port, [("a", *a, ["a.test"])]), [port])
    default = negotiated(s_client(port, "-tls1_3"))
    if cpu_has_aes():
        assert default == "TLS_AES_128_GCM_SHA256"
    chacha = "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384"
    assert negotiated(s_client(port, "-tls1_3", "-ciphersuites", chacha)) == "TLS_CHACHA20_POLY1305_SHA256"
    only_256 = "TLS_AES_256_GCM_SHA384"
    assert negotiated(s_client(port, "-tls1_3", "-ciphersuites", only_256)) == "TLS_AES_256_GCM_SHA384"
    # curl (OpenSSL) makes a request over each.
    cases = [(chacha, "TLS_CHACHA20_POLY1305_SHA256"), (only_256, "TLS_AES_256_GCM_SHA384")]
    if cpu_has_aes():
        cases.append(("TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"))
    for suites, want in cases:
        code, body, err = curl(
            "-v", "--cacert", str(a[0]), "--resolve", f"a.test:{port}:127.0.0.1", "--tlsv1.3",
            "--tls13-ciphers", suites, f"https://a.test:{port}/",
        )
        assert (code, body) == (200, "hello\n"), err
        assert f"TLSv1.3 / {want}" in err, err


def test_a_listener_sets_its_own_tls13_suites_in_its_order(tmp_path, gatehouse):
    port = free_port()
    a = make_cert(tmp_path, "a", ["a.test"])
    suites = ", tls13_ciphers: [TLS_CHACHA20_POLY1305_SHA256, TLS_AES_256_GCM_SHA384]"
    gatehouse(config(port, [("a", *a, ["a.test"])], suites), [port])
    # The server's order, whatever the client lists first.
    assert negotiated(s_client(port, "-tls1_3")) == "TLS_CHACHA20_POLY1305_SHA256"
    offer = "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256"
    assert negotiated(s_client(port, "-tls1_3", "-ciphersuites", offer)) == "TLS_AES_256_GCM_SHA384"
    out = s_client(port, "-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256")
    assert "Cipher is (NONE)" in out or "alert" in out.lower(), out


def test_session_resumption_can_be_turned_off(tmp_path, gatehouse):
    a = make_cert(tmp_path, "a", ["a.test"])
    sess = tmp_path / "sess.pem"
    for resumption, expect_reuse in (("true", True), ("false", False)):
        port = free_port()
        gatehouse(config(port, [("a", *a, ["a.test"])], f", session_resumption: {resumption}"), [port])
        if sess.exists():
            sess.unlink()
        s_client(port, "-tls1_2", "-sess_out", str(sess))
        out = s_client(port, "-tls1_2", "-sess_in", str(sess)) if sess.exists() else ""
        assert ("Reused, TLSv1.2" in out) == expect_reuse, out
