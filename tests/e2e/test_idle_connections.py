"""Thousands of idle client connections, then a request on every one of
them at once: all answered (issue 33). An idle connection holds no read or
write buffer (crates/l7/src/idle.rs); this checks that reading from the
worker's scratch buffer and the spare pools loses nothing when every
connection wakes together, over HTTP/1.1, HTTPS/1.1 and HTTP/2 mixed."""

import asyncio
import resource
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import idle_conns as C  # noqa: E402

from harness import free_port, make_cert  # noqa: E402

CONNS = 5000


@pytest.fixture
def many_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, CONNS + 1000)
    if want < CONNS + 200:
        pytest.skip(f"open-file limit {hard} is under {CONNS + 200}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_five_thousand_idle_connections_all_answer_at_once(tmp_path, gatehouse, many_files):
    crt, key = make_cert(tmp_path, "site", ["localhost"])
    http, https = free_port(), free_port()
    gatehouse(f"""
workers: 1
access_log: {{ path: off }}
http: {{ client_idle_timeout: 120s }}
listeners:
  - {{ name: web, address: 127.0.0.1:{http} }}
  - {{ name: secure, address: 127.0.0.1:{https}, protocol: https }}
certificates: [{{ name: site, cert: {crt}, key: {key}, sni: [localhost] }}]
routes: [{{ name: all, direct_response: {{ status: 200, body: "ok\\n" }} }}]
""", wait_ports=[http, https])

    async def run():
        third = CONNS // 3
        conns = []
        for kind, port, n in (("http1", http, third), ("https1", https, third), ("h2", https, CONNS - 2 * third)):
            conns += await C.open_idle(kind, port, n)
        await asyncio.sleep(1)
        answers = await C.request_all(conns)
        for c in conns:
            c.close()
        return answers

    answers = asyncio.run(run())
    failed = [a for a in answers if a != 200]
    assert not failed, f"{len(failed)} of {len(answers)} not answered: {failed[:5]}"
    assert len(answers) == CONNS


def test_a_thousand_idle_http3_connections_all_answer_at_once(tmp_path, gatehouse, many_files):
    """The same over HTTP/3: quic-go clients (`h3load -idle`), each after
    one request; an idle connection's task gives up its request slots, and
    they come back when every connection asks again at once."""
    import idle_memory as M

    crt, key = make_cert(tmp_path, "site", ["localhost"])
    https = free_port()
    gatehouse(f"""
workers: 1
access_log: {{ path: off }}
http: {{ client_idle_timeout: 120s }}
listeners:
  - {{ name: secure, address: 127.0.0.1:{https}, protocol: https, http3: true }}
certificates: [{{ name: site, cert: {crt}, key: {key}, sni: [localhost] }}]
routes: [{{ name: all, direct_response: {{ status: 200, body: "ok\\n" }} }}]
""", wait_ports=[https])
    n = 1000
    clients = M.h3_idle(https, n)
    answered, first_error = M.h3_ask_all(clients)
    assert answered == n, f"{answered} of {n} idle HTTP/3 connections answered; first error: {first_error}"
