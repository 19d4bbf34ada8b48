"""The sandbox as bubblewrap arguments, without running it."""

from pathlib import Path

import pytest

from egressd.launcher import LaunchError, parse_size
from egressd.sandbox import CA_VARIABLES, PROXY_VARIABLES, SandboxSpec, bwrap_arguments, environment, forbidden_overlap

SPEC = SandboxSpec(outside_socket=Path("/tmp/x/proxy.sock"), outside_ca=Path("/tmp/x/ca.pem"),
                   outside_forwarder=Path("/tmp/x/forwarder.py"), token="T" * 43,
                   placeholders={"API_KEY": "egressd_ph_abc"}, command=["curl", "https://a.test/"],
                   ro=[Path("/srv/data")], rw=[Path("/srv/out")], seccomp_fd=7,
                   existing=frozenset({"/etc/shadow", "/etc/ssh"}), directories=frozenset({"/etc/ssh"}))


def pairs(args: list[str], flag: str, width: int) -> list[tuple[str, ...]]:
    return [tuple(args[i + 1:i + 1 + width]) for i, arg in enumerate(args) if arg == flag]


def test_namespaces_privileges_and_command() -> None:
    args = bwrap_arguments(SPEC, as_nobody=True)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in args
    assert pairs(args, "--cap-drop", 1) == [("ALL",)]
    assert pairs(args, "--uid", 1) == [("65534",)] and pairs(args, "--seccomp", 1) == [("7",)]
    assert args[-4:] == ["/run/egressd/proxy.sock", "--", "curl", "https://a.test/"]
    assert "--uid" not in bwrap_arguments(SPEC, as_nobody=False)


def test_filesystem() -> None:
    args = bwrap_arguments(SPEC, as_nobody=True)
    ro = pairs(args, "--ro-bind", 2)
    assert ("/usr", "/usr") in ro and ("/etc", "/etc") in ro and ("/srv/data", "/srv/data") in ro
    assert ("/dev/null", "/etc/shadow") in ro and ("/etc/ssh",) in pairs(args, "--tmpfs", 1)
    assert ("/srv/out", "/srv/out") in pairs(args, "--bind", 2)
    assert ("/tmp/x/proxy.sock", "/run/egressd/proxy.sock") in pairs(args, "--bind", 2)
    assert ("/etc/gshadow",) not in pairs(args, "--tmpfs", 1)  # absent here: nothing to mask


def test_environment_is_complete_and_nothing_else() -> None:
    env = environment(SPEC)
    proxy = f"http://egressd:{'T' * 43}@127.0.0.1:3128"
    assert all(env[name] == proxy for name in PROXY_VARIABLES)
    assert all(env[name] == "/run/egressd/ca.pem" for name in CA_VARIABLES)
    assert env["NO_PROXY"] == "" and env["API_KEY"] == "egressd_ph_abc" and env["HOME"].startswith("/tmp")
    assert set(env) == {"PATH", "HOME", "LANG", "TZ", "NO_PROXY", "API_KEY", *PROXY_VARIABLES, *CA_VARIABLES}


def test_protected_paths() -> None:
    protected = [Path("/var/lib/egressd"), Path("/etc/egressd/egressd.toml")]
    assert forbidden_overlap([Path("/var/lib")], protected) == (Path("/var/lib"), Path("/var/lib/egressd"))
    assert forbidden_overlap([Path("/var/lib/egressd/ca")], protected) is not None
    assert forbidden_overlap([Path("/etc/egressd")], protected) is not None
    assert forbidden_overlap([Path("/srv"), Path("/var/lib/other")], protected) is None


@pytest.mark.parametrize(("text", "size"), [("512M", 512 << 20), ("2G", 2 << 30), ("64MiB", 64 << 20),
                                            ("1000", 1000), ("8k", 8 << 10)])
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "-1M", "lots", "1T"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(LaunchError):
        parse_size(text)
