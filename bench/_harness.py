"""What every benchmark needs: a network namespace of its own, the tests' DNS server and HTTPS upstream on
loopback, and egressd daemons to measure."""

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.dns_server import ScriptedDNS  # noqa: E402
from tests.support.egressd_process import Egressd  # noqa: E402
from tests.support.upstream import HttpsUpstream, make_test_ca, write_ca_pem  # noqa: E402


def isolate() -> None:
    """Re-executes this script in a network namespace of its own (loopback only) unless it is in one."""
    if sorted(name for _, name in socket.if_nameindex()) == ["lo"]:
        return
    if os.geteuid() != 0:
        sys.exit(f"{sys.argv[0]}: run as root (it makes a network namespace of its own)")
    script = 'ip link set lo up && exec "$0" "$@"'
    os.execvp("unshare", ["unshare", "--net", "--", "/bin/sh", "-c", script, sys.executable, *sys.argv])  # noqa: S606


@contextmanager
def loopback_world() -> Iterator[tuple[Path, ScriptedDNS, Path]]:
    """(a scratch dir, the DNS server with api.example.test → the upstream, the upstream's CA file)."""
    root = Path(tempfile.mkdtemp(prefix="egressd-bench-"))
    ca = make_test_ca()
    ca_pem = write_ca_pem(ca, root / "upstream-ca.pem")
    with ScriptedDNS() as dns, HttpsUpstream(ip="127.0.0.10", ca=ca, hostnames=("api.example.test",)):
        dns.add("api.example.test", "127.0.0.10")
        yield root, dns, ca_pem


__all__ = ["Egressd", "isolate", "loopback_world"]
