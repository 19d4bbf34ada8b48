"""Tests that bind 127.x on privileged ports or drive the proxy run only in an isolated network namespace."""

import socket

import pytest


def require_isolated_netns() -> None:
    # /sys/class/net shows the namespace sysfs was mounted in, not ours: ask the kernel instead.
    names = sorted(name for _index, name in socket.if_nameindex())
    if names != ["lo"]:
        pytest.fail(
            f"network interfaces {names}: these tests must run inside an isolated network namespace "
            "with only lo, so nothing can leave this machine; run them via scripts/test"
        )
