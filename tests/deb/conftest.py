"""The Debian package tests run against a Debian 13 root that scripts/deb-test prepares (the package built, linted
and installed there with apt); these tests never touch the network. Without that root they are skipped, except
in CI, where a missing root is a failure: CI must run scripts/deb-test."""

import os
from pathlib import Path

import pytest

from tests.support.netns import require_isolated_netns


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "deb: the Debian package, installed in a Debian 13 root (scripts/deb-test)")
    config.addinivalue_line("markers", "incremental: steps in order; after one fails the rest are not run")


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if (call.excinfo is not None and item.get_closest_marker("incremental") is not None and item.parent is not None
            and not call.excinfo.errisinstance((pytest.skip.Exception, pytest.xfail.Exception))):
        item.parent._deb_failed_step = item.name  # type: ignore[attr-defined]


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("incremental") is not None and item.parent is not None:
        failed = getattr(item.parent, "_deb_failed_step", None)
        if failed is not None:
            pytest.xfail(f"an earlier step failed: {failed}")


def _environment_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


@pytest.fixture(scope="session")
def deb_root() -> Path:
    """The prepared root (EGRESSD_DEB_ROOT), with /proc and /dev mounted, in a network namespace of our own."""
    root = _environment_path("EGRESSD_DEB_ROOT")
    if root is None:
        message = ("EGRESSD_DEB_ROOT is not set: the Debian package tests need the root that scripts/deb-test "
                   "builds (run scripts/deb-test as root)")
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI must run them", pytrace=False)
        pytest.skip(message)
    require_isolated_netns()
    problems = []
    if not (root / "etc/os-release").is_file():
        problems.append(f"{root} is not a Debian root (no etc/os-release)")
    elif "VERSION_CODENAME=trixie" not in (root / "etc/os-release").read_text():
        problems.append(f"{root} is not a Debian 13 (trixie) root")
    if not (root / "proc/self").exists():
        problems.append(f"{root}/proc is not mounted")
    if not (root / "dev/null").exists():
        problems.append(f"{root}/dev is not mounted")
    if problems:
        pytest.fail("; ".join(problems) + " (scripts/deb-test prepares the root)", pytrace=False)
    return root


@pytest.fixture(scope="session")
def deb_v2() -> Path:
    """The rebuilt package with a higher version, for the upgrade (EGRESSD_DEB_V2)."""
    path = _environment_path("EGRESSD_DEB_V2")
    if path is None or not path.is_file():
        pytest.fail(f"EGRESSD_DEB_V2={path}: not a file; scripts/deb-test builds it", pytrace=False)
    return path
