"""`gatehouse check`: every mistake listed with its field path; exit codes."""

import subprocess

from harness import BIN, ROOT

BAD = """
workers: lots
listeners:
  - name: web
    address: 127.0.0.1:99999
  - name: web
    address: 127.0.0.1:8081
    protocol: https
certificates:
  - name: c
    cert: /nonexistent/c.pem
    key: /nonexistent/c.key
upstreams:
  - name: api
    balance: random
    endpoints: [127.0.0.1:9001]
    health_check: { interval: soon, rise: 0, timout: 1s }
routes:
  - name: r1
    upstream: api-v2
    match: { path: no-slash }
    rate_limit: { rate: 5 }
    colour: blue
"""


def run_check(path):
    return subprocess.run([str(BIN), "check", "-c", str(path)], capture_output=True, text=True, timeout=30)


def test_several_mistakes_are_each_listed_with_their_path(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    p = run_check(f)
    assert p.returncode == 1
    lines = p.stderr.splitlines()
    expected = [
        "workers: expected an integer",
        "listeners[0].address: expected an address with a port",
        "listeners[1].name: duplicate listener name \"web\"",
        "upstreams[0].balance: expected one of round_robin, weighted_round_robin, least_connections, maglev",
        "upstreams[0].health_check.interval: expected a duration",
        "upstreams[0].health_check.rise: must be at least 1",
        "routes[0].upstream: no upstream named \"api-v2\"",
        "routes[0].match.path: must start with /",
        "routes[0].colour: unknown field",
        "upstreams[0].health_check.timout: unknown field; did you mean timeout?",
    ]
    for e in expected:
        assert any(l.startswith(f"{f}: {e}") for l in lines), f"missing {e!r} in:\n{p.stderr}"
    # A key near no known one gets no guess.
    assert not any("colour: unknown field; did you mean" in l for l in lines), p.stderr


def test_an_unquoted_ipv6_listener_address_is_named(tmp_path):
    f = tmp_path / "v6.yaml"
    f.write_text("listeners:\n  - name: web\n    address: [::]:8443\nroutes: [{ name: r, direct_response: { status: 200 } }]\n")
    p = run_check(f)
    assert p.returncode == 1
    assert 'quote [::]:8443 as "[::]:8443": a bare [ starts a YAML list (line 3)' in p.stderr, p.stderr


def test_unreadable_certificate_files_are_reported(tmp_path):
    f = tmp_path / "certs.yaml"
    f.write_text("""
listeners: [{ name: s, address: 127.0.0.1:8443, protocol: https }]
certificates: [{ name: c, cert: missing.pem, key: missing.key }]
routes: [{ name: r, direct_response: { status: 200 } }]
""")
    p = run_check(f)
    assert p.returncode == 1
    assert f"{f}: certificates[0].cert: cannot read" in p.stderr


def test_the_example_config_is_valid():
    p = run_check(ROOT / "examples" / "gatehouse.yaml")
    assert p.returncode == 0, p.stderr
    assert "configuration is valid" in p.stdout


def test_version():
    p = subprocess.run([str(BIN), "version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("gatehouse ")


def test_the_readme_example_is_valid(tmp_path):
    """The worked example in README.md must pass `gatehouse check`."""
    import re

    from harness import make_cert

    text = (ROOT / "README.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    certs = tmp_path / "certs"
    certs.mkdir()
    for name, kind in (("example-ec", "ec"), ("example-rsa", "rsa")):
        crt, key = make_cert(certs, name, ["example.com", "*.example.com"], kind=kind)
        crt.rename(certs / f"{name}.pem")
    f = tmp_path / "gatehouse.yaml"
    f.write_text(example)
    p = run_check(f)
    assert p.returncode == 0, p.stderr


def test_store_errors_name_their_fields(tmp_path):
    cfg = tmp_path / "g.yaml"
    cfg.write_text("""
store: { type: etcd, endpoints: [127.0.0.1:2379], prefix: gatehouse/ }
listeners: [{ name: web, address: 127.0.0.1:8080 }]
""")
    p = run_check(cfg)
    assert p.returncode == 1
    assert "store.endpoints[0]: expected an http:// or https:// URL" in p.stderr, p.stderr
    assert "store.prefix: must start with /" in p.stderr, p.stderr
    cfg.write_text("store: { type: zookeeper }\n")
    p = run_check(cfg)
    assert "store.type: expected file or etcd, found \"zookeeper\"" in p.stderr, p.stderr
    cfg.write_text("store: { type: etcd }\n")
    p = run_check(cfg)
    assert "store.endpoints" in p.stderr, p.stderr


def check_refuses(tmp_path, name, text):
    """`gatehouse check` on `text` exits 1; returns what it printed on stderr."""
    f = tmp_path / name
    f.write_text(text)
    p = run_check(f)
    assert p.returncode == 1, p.stdout
    return p.stderr


def assert_errors_at(err, expected):
    """Each (field path, words) has an error line at that path saying them."""
    for path, words in expected:
        line = next((l for l in err.splitlines() if f": {path}:" in l), None)
        assert line and words in line, f"{path}: {err}"


HA_BAD = """
l4:
  interfaces: [eth1]
  ha:
    initial: primary
    announce: 1000
    sync:
      listen: 10.0.0.0:8200
      peer: 10.0.0.0:8200
      key: not-a-key
      refresh: 2h
      max_rate: 0
  services: []
"""


def test_ha_mistakes_name_their_fields(tmp_path):
    err = check_refuses(tmp_path, "ha.yaml", HA_BAD)
    assert_errors_at(err, [
        ("l4.ha.initial", "master, backup"),
        ("l4.ha.announce", "0 to 100"),
        ("l4.ha.sync.peer", "own listen address"),
        ("l4.ha.sync.node_id", "last byte of listen"),
        ("l4.ha.sync.key", "32 bytes"),
        ("l4.ha.sync.refresh", "1s to 1h"),
        ("l4.ha.sync.max_rate", "above 0"),
    ])
    # The key's text is not echoed.
    assert "not-a-key" not in err


SNAT_BAD = """
l4:
  interfaces: [eth1]
  local_addresses: [10.0.0.3]
  snat:
    - name: out
      sources: [10.0.1.0/24, "2001:db8::/64"]
      addresses: [10.0.0.100, 10.0.0.3]
    - name: out
      sources: []
      addresses: []
      ports: 9000-80
  services:
    - name: web
      address: 10.0.0.100:80
      real_servers: [10.0.1.11:80]
"""


def test_snat_mistakes_name_their_fields(tmp_path):
    err = check_refuses(tmp_path, "snat.yaml", SNAT_BAD)
    assert_errors_at(err, [
        ("l4.snat[0].addresses[0]", "VIP"),
        ("l4.snat[0].addresses[1]", "FNAT local address"),
        ("l4.snat[0].sources[1]", "no address of its family"),
        ("l4.snat[1].sources", "at least one network"),
        ("l4.snat[1].addresses", "at least one address"),
        ("l4.snat[1].ports", "port range such as 1024-65535"),
    ])
    assert 'l4.snat[1].name: duplicate SNAT rule name "out"' in err, err
