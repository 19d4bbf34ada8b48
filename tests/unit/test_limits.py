"""Memory and process caps on real cgroups, as root: a memory hog is OOM-killed at its cap, a fork loop runs into
pids.max, kill_all and remove leave nothing behind; and the prlimit fallback where no cgroup can be had."""

import ctypes
import os
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from egressd import limits as limits_module
from egressd.limits import Confinement, Limits, confine

MiB = 1 << 20
PR_SET_CHILD_SUBREAPER = 36
LIMITS = Limits(64 * MiB, 32)

HOG = """
chunks = []
for _ in range(200):
    chunks.append(b"x" * (1 << 20))  # written, so charged, unlike a calloc'ed bytearray
print("survived", flush=True)
"""

FORKS = """
import os, time
forked = failed = 0
for _ in range(100):
    try:
        pid = os.fork()
    except BlockingIOError:
        failed += 1
        continue
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
print(forked, failed, flush=True)
time.sleep(60)
"""


def really_root() -> bool:
    """Root of the initial user namespace: mapped root (unshare --map-root-user) can't write cgroups."""
    if os.geteuid() != 0:
        return False
    first = Path("/proc/self/uid_map").read_text().split()
    return first[:3] == ["0", "0", "4294967295"]


def require_cgroups() -> None:
    """Real tests: under CI they must run, and fail rather than skip; elsewhere they skip without root."""
    if really_root():
        return
    if os.environ.get("CI") == "true":
        pytest.fail("cgroup tests need root (of the initial user namespace)")
    pytest.skip("cgroup tests need root (of the initial user namespace)")


def own_cgroup(controller: str) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


def unique_name() -> str:
    return f"test-{secrets.token_hex(4)}"


@pytest.fixture
def confinement() -> Iterator[Confinement]:
    require_cgroups()
    confined = confine(unique_name(), LIMITS)
    try:
        yield confined
    finally:
        confined.remove()


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout} s"
    return proc.stdout.readline()


def wait_for_processes(confined: Confinement, count: int, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(pids := confined.processes()) < count:
        assert time.monotonic() < deadline, f"{pids} in the cgroups, wanted {count}"
        time.sleep(0.02)
    return pids


def test_mechanisms_are_child_cgroups_of_this_process_with_the_limits_set(confinement: Confinement) -> None:
    # On a host with the v1 controllers mounted (hybrid, like Debian 12 here), v1 is what there is.
    for limit in ("memory", "pids"):
        expected = "cgroup-v1" if own_cgroup(limit) is not None else "cgroup-v2"
        assert confinement.mechanisms[limit] == expected
    if confinement.mechanisms == {"memory": "cgroup-v1", "pids": "cgroup-v1"}:
        memory, pids = confinement.cgroups
        assert memory == Path("/sys/fs/cgroup/memory", str(own_cgroup("memory")).lstrip("/"), memory.name)
        assert pids == Path("/sys/fs/cgroup/pids", str(own_cgroup("pids")).lstrip("/"), pids.name)
        assert memory.name == pids.name == f"egressd-{confinement.name}"
        assert int((memory / "memory.limit_in_bytes").read_text()) == 64 * MiB
        if (memory / "memory.memsw.limit_in_bytes").exists():
            assert int((memory / "memory.memsw.limit_in_bytes").read_text()) == 64 * MiB
        assert "oom_kill_disable 0" in (memory / "memory.oom_control").read_text()
        assert (pids / "pids.max").read_text().strip() == "32"
    prefix = confinement.command_prefix()
    assert prefix[:2] == ["/bin/sh", "-c"]
    assert prefix[2].endswith('exec "$0" "$@"')
    assert len(prefix) == 3  # no prlimit: both limits are cgroups


def test_the_command_runs_inside_the_cgroups(confinement: Confinement) -> None:
    out = subprocess.run(
        [*confinement.command_prefix(), "/bin/cat", "/proc/self/cgroup"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    for limit in ("memory", "pids"):
        line = next(line for line in out.splitlines() if limit in line.split(":")[1].split(","))
        assert line.endswith(f"/egressd-{confinement.name}")
    assert confinement.fired() is None
    assert confinement.processes() == []


def test_a_memory_hog_is_killed_at_its_cap(confinement: Confinement) -> None:
    proc = subprocess.run(
        [*confinement.command_prefix(), sys.executable, "-c", HOG], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode in (-9, 137), proc.stderr
    assert "survived" not in proc.stdout
    assert confinement.fired() == "memory"


@pytest.fixture
def orphans() -> Iterator[set[int]]:
    """Pids to reap at the end: this process becomes the reaper of its orphaned descendants meanwhile.

    The fork loop's children outlive their parent when everything is killed at once, and not every init reaps.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    pids: set[int] = set()
    try:
        yield pids
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            for pid in list(pids):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                except ChildProcessError:
                    pass  # not ours: reaped by another
                pids.discard(pid)
            time.sleep(0.02)


def test_a_fork_loop_runs_into_the_pids_cap_and_kill_all_empties_the_cgroups(
    confinement: Confinement, orphans: set[int]
) -> None:
    proc = subprocess.Popen(
        [*confinement.command_prefix(), sys.executable, "-c", FORKS], stdout=subprocess.PIPE, text=True
    )
    try:
        forked, failed = map(int, read_line(proc, timeout=30).split())
        assert failed > 0
        assert forked + 1 <= LIMITS.pids  # the parent counts too
        assert confinement.fired() == "pids"
        running = confinement.processes()
        orphans.update(running)
        assert len(running) == forked + 1
        confinement.kill_all()
        assert confinement.processes() == []
        assert proc.wait(timeout=10) == -9
    finally:
        confinement.kill_all()
        proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def test_remove_kills_what_runs_and_deletes_the_cgroups() -> None:
    require_cgroups()
    confined = confine(unique_name(), LIMITS)
    directories = confined.cgroups
    assert directories and all(directory.is_dir() for directory in directories)
    proc = subprocess.Popen([*confined.command_prefix(), "/bin/sleep", "60"])
    try:
        wait_for_processes(confined, 1)
        confined.remove()
        assert proc.wait(timeout=10) == -9
        assert not any(directory.exists() for directory in directories)
        confined.remove()  # again: nothing left to do, and it never raises
    finally:
        proc.kill()
        proc.wait(timeout=10)
        confined.remove()


def test_with_removes_on_exit() -> None:
    require_cgroups()
    with confine(unique_name(), LIMITS) as confined:
        directories = confined.cgroups
        subprocess.run([*confined.command_prefix(), "/bin/true"], timeout=30, check=True)
    assert not any(directory.exists() for directory in directories)


def test_a_command_that_cannot_join_its_cgroups_never_runs() -> None:
    require_cgroups()
    confined = confine(unique_name(), LIMITS)
    prefix = confined.command_prefix()
    confined.remove()
    proc = subprocess.run([*prefix, "/bin/echo", "ran"], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "ran" not in proc.stdout


def test_a_name_in_use_is_refused_and_left_alone(confinement: Confinement) -> None:
    with pytest.raises(FileExistsError):
        confine(confinement.name, LIMITS)
    assert all(directory.is_dir() for directory in confinement.cgroups)


@pytest.mark.parametrize("name", ["", "../escape", "a/b", "a b", "ä"])
def test_names_outside_the_safe_alphabet_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        confine(name, LIMITS)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Limits(0, 32)
    with pytest.raises(ValueError):
        Limits(64 * MiB, -1)


RLIMITS = "import resource; print(*resource.getrlimit(resource.RLIMIT_AS), *resource.getrlimit(resource.RLIMIT_NPROC))"


def test_without_cgroups_both_limits_fall_back_to_prlimit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits_module, "_hierarchies", dict)
    with confine(unique_name(), LIMITS) as confined:
        assert confined.mechanisms == {"memory": "rlimit", "pids": "rlimit"}
        prefix = confined.command_prefix()
        assert os.path.basename(prefix[0]) == "prlimit"
        assert prefix[1:] == [f"--as={64 * MiB}", "--nproc=32", "--"]
        assert confined.cgroups == []
        out = subprocess.run([*prefix, sys.executable, "-c", RLIMITS], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(64 * MiB)] * 2 + ["32"] * 2
        assert confined.fired() is None  # an rlimit leaves no record of refusing
        assert confined.processes() == []


def test_a_missing_controller_falls_back_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    require_cgroups()
    real = limits_module._hierarchies
    monkeypatch.setattr(limits_module, "_hierarchies", lambda: {k: v for k, v in real().items() if k != "pids"})
    with confine(unique_name(), LIMITS) as confined:
        assert confined.mechanisms["pids"] == "rlimit"
        assert confined.mechanisms["memory"] != "rlimit"
        prefix = confined.command_prefix()
        assert prefix[:2] == ["/bin/sh", "-c"]
        assert os.path.basename(prefix[3]) == "prlimit"
        assert prefix[4:] == ["--nproc=32", "--"]
        out = subprocess.run([*prefix, sys.executable, "-c", RLIMITS], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[2:] == ["32", "32"]
