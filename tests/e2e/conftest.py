import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import BIN, Gatehouse, RawUpstream, Upstream  # noqa: E402


def pytest_sessionstart(session):
    if not BIN.exists():
        raise pytest.UsageError(f"{BIN} is missing: run `make build` first (make test does)")


@pytest.fixture
def upstream():
    """Factory: upstream("name") starts a real HTTP server; all stop at the end."""
    made = []

    def make(name, port=None):
        u = Upstream(name, port)
        made.append(u)
        return u

    yield make
    for u in made:
        u.stop()


@pytest.fixture
def raw_upstream():
    made = []

    def make(**kw):
        u = RawUpstream(**kw)
        made.append(u)
        return u

    yield make
    for u in made:
        u.stop()


@pytest.fixture
def gatehouse(tmp_path):
    """Factory: gatehouse(config, wait_ports=[...]) starts Gatehouse."""
    made = []

    def make(config, wait_ports=(), subdir="gh"):
        d = tmp_path / f"{subdir}{len(made)}"
        d.mkdir()
        g = Gatehouse(d, config, wait_ports)
        made.append(g)
        return g

    yield make
    for g in made:
        g.stop()
