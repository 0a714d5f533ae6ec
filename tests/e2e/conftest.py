import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import BIN, Gatehouse, RawUpstream, Upstream  # noqa: E402


def pytest_sessionstart(session):
    if not BIN.exists():
        raise pytest.UsageError(f"{BIN} is missing: run `make build` first (make test does)")


def _stopping_factory(cls):
    """A fixture body: yields a factory for `cls`; stops what it made."""
    made = []

    def make(*args, **kwargs):
        thing = cls(*args, **kwargs)
        made.append(thing)
        return thing

    yield make
    for thing in made:
        thing.stop()


@pytest.fixture
def upstream():
    """Factory: upstream("name") starts a real HTTP server; all stop at the end."""
    yield from _stopping_factory(Upstream)


@pytest.fixture
def raw_upstream():
    """Factory: raw_upstream(response=...) starts a TCP server that records bytes."""
    yield from _stopping_factory(RawUpstream)


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium with a fresh profile (tests/e2e/browser.py)."""
    from browser import chromium

    d = chromium(tmp_path / "chromium-profile")
    yield d
    d.quit()


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
