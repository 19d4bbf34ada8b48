"""The seccomp filter in a real bubblewrap sandbox: what it refuses, that ordinary work still runs, and a control run
without the filter showing that the refusals come from the filter, not from the sandbox's dropped capabilities."""

import errno
import json
import os
import platform
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

from egressd.seccomp import SeccompUnavailable, build_filter, filter_fd

BWRAP = "/usr/bin/bwrap"
SANDBOX_PYTHON = "/usr/bin/python3"  # the system's, since only /usr is bound into the sandbox
SANDBOX_ARGS = [
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
]

# Runs inside the sandbox (the system Python, maybe older than the project's). Each probe runs in a forked child,
# so one that succeeds (a new user namespace, a tracer) can't change the next; its exit code is the errno, 0 for
# success, or minus the signal that killed it. Syscall numbers are x86_64's.
PROBE = r"""
import ctypes, json, mmap, os, socket, subprocess, threading

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17
SYS_socket, SYS_clone, SYS_keyctl, SYS_io_uring_setup, SYS_clone3, SYS_getpid = 41, 56, 250, 425, 435, 39
X32_SYSCALL_BIT = 0x40000000


def errno_of(rc):
    return ctypes.get_errno() if rc == -1 else 0


HIGH = 1 << 32  # ignored by the kernel in an int argument (and in clone's flags): must not get past the filter


def raw_clone(high=0):
    pid = libc.syscall(SYS_clone, ctypes.c_long(high | CLONE_NEWUSER | SIGCHLD), 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        return 0
    return ctypes.get_errno()


def opened(*args):
    socket.socket(*args).close()
    return 0


def raw_socket(family, kind, protocol):
    fd = libc.syscall(SYS_socket, ctypes.c_long(family), ctypes.c_long(kind), protocol)
    if fd >= 0:
        os.close(fd)
    return errno_of(fd)


def paired(*args):
    for s in socket.socketpair(*args):
        s.close()
    return 0


def int80_getpid():
    # mov eax, 20 (i386 getpid); int 0x80; ret
    code = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    pid = ctypes.CFUNCTYPE(ctypes.c_long)(address)()
    return 0 if pid == os.getpid() else 100


def tcp_roundtrip():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=5) as client:
            peer, _ = server.accept()
            with peer:
                client.sendall(b"ping")
                return 0 if peer.recv(4) == b"ping" else 100


def forked():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    return 0 if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7 else 100


def threaded():
    seen = []
    thread = threading.Thread(target=seen.append, args=(1,))
    thread.start()
    thread.join()
    return 0 if seen == [1] else 100


def spawned():
    return subprocess.run(["/usr/bin/true"], timeout=10).returncode


def seccomp_mode():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Seccomp:"):
                return int(line.split()[1])
    return 100


PROBES = {
    "unshare_user": lambda: errno_of(libc.unshare(CLONE_NEWUSER)),
    "unshare_net": lambda: errno_of(libc.unshare(CLONE_NEWNET)),
    "setns": lambda: errno_of(libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0)),
    "clone_newuser": raw_clone,
    "clone_newuser_high_bits": lambda: raw_clone(HIGH),
    "clone3": lambda: errno_of(libc.syscall(SYS_clone3, None, 0)),
    "ptrace_traceme": lambda: errno_of(libc.ptrace(0, 0, None, None)),
    "ptrace_cont": lambda: errno_of(libc.ptrace(7, 1, None, None)),
    "keyctl": lambda: errno_of(libc.syscall(SYS_keyctl, 0, -3, 0)),
    "io_uring_setup": lambda: errno_of(libc.syscall(SYS_io_uring_setup, 1, None)),
    "mount": lambda: errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
    "netlink": lambda: opened(socket.AF_NETLINK, socket.SOCK_RAW, 0),
    "netlink_dgram": lambda: opened(socket.AF_NETLINK, socket.SOCK_DGRAM, 0),
    "netlink_pair": lambda: paired(socket.AF_NETLINK, socket.SOCK_RAW, 0),
    "netlink_high_bits": lambda: raw_socket(HIGH | socket.AF_NETLINK, socket.SOCK_DGRAM, 0),
    "packet_high_bits": lambda: raw_socket(HIGH | socket.AF_PACKET, socket.SOCK_DGRAM, 0),
    "raw_inet_high_bits": lambda: raw_socket(socket.AF_INET, HIGH | socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "packet": lambda: opened(socket.AF_PACKET, socket.SOCK_RAW, 0),
    "raw_inet": lambda: opened(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "raw_inet_flags": lambda: opened(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK, 1),
    "raw_inet6": lambda: opened(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
    "x32_getpid": lambda: errno_of(libc.syscall(X32_SYSCALL_BIT | SYS_getpid)),
    "i386_getpid": int80_getpid,
    "tcp": tcp_roundtrip,
    "udp": lambda: opened(socket.AF_INET, socket.SOCK_DGRAM),
    "unix_pair": lambda: paired(socket.AF_UNIX, socket.SOCK_STREAM),
    "fork": forked,
    "thread": threaded,
    "subprocess": spawned,
    "seccomp_mode": seccomp_mode,
}


def run(probe):
    pid = os.fork()
    if pid == 0:
        try:
            code = probe()
        except OSError as exc:
            code = exc.errno
        except BaseException:
            code = 101
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


print(json.dumps({name: run(probe) for name, probe in PROBES.items()}))
"""

REFUSED = [
    "unshare_user",
    "unshare_net",
    "setns",
    "clone_newuser",
    "clone_newuser_high_bits",
    "ptrace_traceme",
    "ptrace_cont",
    "keyctl",
    "io_uring_setup",
    "mount",
    "netlink",
    "netlink_dgram",
    "netlink_pair",
    "netlink_high_bits",
    "packet",
    "packet_high_bits",
    "raw_inet",
    "raw_inet_flags",
    "raw_inet6",
    "raw_inet_high_bits",
]
WORKING = ["tcp", "udp", "unix_pair", "fork", "thread", "subprocess"]


def require_sandbox_tools() -> None:
    """Real tests: under CI a missing tool fails them; elsewhere they skip without root or the tools."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    if not shutil.which(BWRAP):
        problems.append(f"{BWRAP} missing (Debian package bubblewrap)")
    if not shutil.which(SANDBOX_PYTHON):
        problems.append(f"{SANDBOX_PYTHON} missing")
    try:
        build_filter()
    except SeccompUnavailable as exc:
        problems.append(str(exc))
    if platform.machine() != "x86_64":
        problems.append("the probes use x86_64 syscall numbers")
    if problems:
        if os.environ.get("CI") == "true":
            pytest.fail("; ".join(problems))
        pytest.skip("; ".join(problems))


@pytest.fixture(scope="module")
def program() -> bytes:
    require_sandbox_tools()
    return build_filter()


def sandboxed(program: bytes | None, keep_capabilities: bool = False) -> dict[str, int]:
    """Runs the probe in bwrap, with the filter unless program is None; returns each probe's result.

    keep_capabilities runs it with every capability (bwrap run by root keeps them in its namespaces), so that what
    the filter refuses isn't refused anyway for want of one.
    """
    args = [BWRAP, *SANDBOX_ARGS]
    if keep_capabilities:
        at = args.index("--cap-drop")
        args[at : at + 2] = ["--cap-add", "ALL"]
    fds: list[int] = []
    if program is not None:
        fd = filter_fd(program)
        fds.append(fd)
        args += ["--seccomp", str(fd)]
    try:
        proc = subprocess.Popen(
            [*args, "--", SANDBOX_PYTHON, "-c", PROBE],
            pass_fds=fds,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        for fd in fds:
            os.close(fd)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out.splitlines()[-1])


@pytest.fixture(scope="module")
def filtered(program: bytes) -> dict[str, int]:
    return sandboxed(program)


@pytest.fixture(scope="module")
def filtered_with_capabilities(program: bytes) -> dict[str, int]:
    return sandboxed(program, keep_capabilities=True)


@pytest.fixture(scope="module")
def unfiltered(program: bytes) -> dict[str, int]:
    return sandboxed(None, keep_capabilities=True)


def test_the_program_is_a_whole_number_of_bpf_instructions(program: bytes) -> None:
    assert program
    assert len(program) % 8 == 0
    assert len(program) // 8 <= 4096  # the kernel's BPF_MAXINSNS


@pytest.mark.parametrize("size", [16, 200_000])
def test_filter_fd_reads_back_the_program_to_eof(size: int) -> None:
    data = os.urandom(size // 8 * 8)  # 200 kB is over a pipe's default buffer: a memfd then
    fd = filter_fd(data)
    try:
        assert os.get_inheritable(fd)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        assert b"".join(chunks) == data
    finally:
        os.close(fd)


def test_the_filter_is_installed_in_the_sandbox(filtered: dict[str, int], unfiltered: dict[str, int]) -> None:
    assert filtered["seccomp_mode"] == 2  # SECCOMP_MODE_FILTER
    assert unfiltered["seccomp_mode"] == 0


@pytest.mark.parametrize("probe", REFUSED)
def test_refused_with_eperm(filtered: dict[str, int], filtered_with_capabilities: dict[str, int], probe: str) -> None:
    for results in (filtered, filtered_with_capabilities):
        assert results[probe] == errno.EPERM, errno.errorcode.get(results[probe], results[probe])


@pytest.mark.parametrize("probe", REFUSED)
def test_the_refusal_comes_from_the_filter(unfiltered: dict[str, int], probe: str) -> None:
    # Without the filter each one succeeds, or fails for a reason of its own, never EPERM.
    expected = {"ptrace_cont": errno.ESRCH, "io_uring_setup": errno.EFAULT, "netlink_pair": errno.EOPNOTSUPP}
    assert unfiltered[probe] == expected.get(probe, 0), errno.errorcode.get(unfiltered[probe], unfiltered[probe])


def test_clone3_is_enosys_so_libc_falls_back_to_clone(filtered: dict[str, int], unfiltered: dict[str, int]) -> None:
    assert filtered["clone3"] == errno.ENOSYS
    assert unfiltered["clone3"] == errno.EINVAL  # a null clone_args: the kernel itself looked at it


@pytest.mark.parametrize("probe", ["x32_getpid", "i386_getpid"])
def test_other_abis_kill_the_process(filtered: dict[str, int], unfiltered: dict[str, int], probe: str) -> None:
    assert filtered[probe] == -signal.SIGSYS
    assert unfiltered[probe] != -signal.SIGSYS


@pytest.mark.parametrize("probe", WORKING)
def test_ordinary_work_still_runs(filtered: dict[str, int], unfiltered: dict[str, int], probe: str) -> None:
    assert filtered[probe] == 0, errno.errorcode.get(filtered[probe], filtered[probe])
    assert unfiltered[probe] == 0


@pytest.fixture
def no_fd_leak() -> Iterator[None]:
    before = set(os.listdir("/proc/self/fd"))
    yield
    assert set(os.listdir("/proc/self/fd")) <= before


def test_running_the_sandbox_leaves_no_descriptor_open(program: bytes, no_fd_leak: None) -> None:
    assert sandboxed(program)["seccomp_mode"] == 2
