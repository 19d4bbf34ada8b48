"""Memory and process caps for one sandbox: a child cgroup of this process's own where the host has the controllers
(cgroup v2, else v1), else rlimits set by prlimit on the sandbox command.

The sandbox command is started with command_prefix() in front of it; that prefix moves the command into the cgroups
before it execs, so everything the command starts is counted and capped from its first instruction.
"""

import contextlib
import errno
import logging
import os
import re
import shlex
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_KILL_SECONDS = 5.0
_RMDIR_SECONDS = 2.0

CGROUP_V2 = "cgroup-v2"
CGROUP_V1 = "cgroup-v1"
RLIMIT = "rlimit"


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    pids: int

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.pids <= 0:
            raise ValueError(f"limits must be positive: {self}")


@dataclass(frozen=True)
class _Hierarchy:
    """This process's own cgroup in one mounted hierarchy."""

    version: int
    directory: Path


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _hierarchies() -> dict[str, _Hierarchy]:
    """Controller name ("memory", "pids") to the hierarchy holding it, for v1; "" to the v2 hierarchy."""
    own: dict[str, str] = {}  # v1 controller, or "" for v2 -> this process's cgroup path
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    found: dict[str, _Hierarchy] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, tail_parts = fields.split(), tail.split()
        if len(parts) < 5 or len(tail_parts) < 3:
            continue
        root, mountpoint = _unescape(parts[3]), Path(_unescape(parts[4]))
        fstype, options = tail_parts[0], tail_parts[2].split(",")
        if fstype == "cgroup2":
            keys, version = [""], 2
        elif fstype == "cgroup":
            keys, version = [option for option in options if option in ("memory", "pids")], 1
        else:
            continue
        for key in keys:
            path = own.get(key)
            if key in found or path is None:
                continue
            # A mount may show only part of the hierarchy (root); this process's cgroup must be inside it.
            relative = os.path.relpath(path, root)
            if relative.startswith(".."):
                continue
            found[key] = _Hierarchy(version, (mountpoint / relative).resolve())
    return found


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_keyed(path: Path) -> dict[str, int]:
    """A flat keyed file ("key value" lines: memory.events, memory.oom_control, pids.events) as a dict."""
    values: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    return values


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


class Confinement:
    """Limits for one sandbox, enforced by the best mechanism the host has: its own child cgroup (v2 memory.max/
    pids.max where the v2 hierarchy has those controllers; else the v1 memory and pids controllers), else
    RLIMIT_AS / RLIMIT_NPROC via prlimit.

    Made by confine(); read fired() before remove(), which deletes the counters it reads.
    """

    mechanisms: dict[str, str]

    def __init__(self, name: str, limits: Limits, mechanisms: dict[str, str], cgroups: dict[str, Path]) -> None:
        self.name = name
        self.limits = limits
        self.mechanisms = mechanisms
        self._cgroups = cgroups  # limit ("memory", "pids") -> its child cgroup, for the cgroup mechanisms
        self._directories = list(dict.fromkeys(cgroups.values()))  # one per hierarchy, in a stable order

    @property
    def cgroups(self) -> list[Path]:
        """The child cgroup directories, one per hierarchy used."""
        return list(self._directories)

    def command_prefix(self) -> list[str]:
        """argv to put before the sandbox command: joins the cgroups (writes its own pid into each cgroup.procs)
        and execs the rest; then prlimit for the limits enforced by rlimit."""
        prefix: list[str] = []
        if self._directories:
            # `&&`: a failed join stops here, so the command never runs uncapped.
            joins = [f"echo $$ > {shlex.quote(str(directory / 'cgroup.procs'))}" for directory in self._directories]
            prefix += ["/bin/sh", "-c", " && ".join([*joins, 'exec "$0" "$@"'])]
        rlimits = []
        if self.mechanisms["memory"] == RLIMIT:
            rlimits.append(f"--as={self.limits.memory_bytes}")
        if self.mechanisms["pids"] == RLIMIT:
            rlimits.append(f"--nproc={self.limits.pids}")
        if rlimits:
            prefix += [shutil.which("prlimit") or "prlimit", *rlimits, "--"]
        return prefix

    def fired(self) -> str | None:
        """ "memory" if the memory limit killed something, else "pids" if the pids limit refused a fork, else None.

        None as well for limits enforced by rlimit: nothing records when those refuse.
        """
        memory = self._cgroups.get("memory")
        if memory is not None:
            if self.mechanisms["memory"] == CGROUP_V2:
                oom_killed = _read_keyed(memory / "memory.events").get("oom_kill", 0) > 0
            else:
                control = _read_keyed(memory / "memory.oom_control")
                if "oom_kill" in control:
                    oom_killed = control["oom_kill"] > 0
                else:  # kernels before 4.13 count no kills; hitting the limit is the best sign left
                    oom_killed = _read_int(memory / "memory.failcnt") > 0
            if oom_killed:
                return "memory"
        pids = self._cgroups.get("pids")
        if pids is not None and _read_keyed(pids / "pids.events").get("max", 0) > 0:
            return "pids"
        return None

    def processes(self) -> list[int]:
        """The pids still in the cgroups (and any cgroups below them)."""
        found: set[int] = set()
        for directory in self._directories:
            for current, _, _ in os.walk(directory):
                with contextlib.suppress(OSError):
                    found.update(int(pid) for pid in Path(current, "cgroup.procs").read_text().split())
        found.discard(0)  # a process outside this pid namespace
        return sorted(found)

    def kill_all(self) -> None:
        """SIGKILLs every process in the cgroups until they are empty, for about 5 s at most."""
        deadline = time.monotonic() + _KILL_SECONDS
        pause = 0.01
        while pids := self.processes():
            if time.monotonic() > deadline:
                log.warning("egressd-%s: processes %s outlived SIGKILL", self.name, pids)
                return
            for limit, directory in self._cgroups.items():
                # cgroup.kill (v2, Linux 5.14+) also catches a fork racing with the kill.
                if self.mechanisms[limit] == CGROUP_V2:
                    with contextlib.suppress(OSError):
                        _write(directory / "cgroup.kill", "1")
            self._kill(pids)
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _kill(self, pids: list[int]) -> None:
        # A pid read from cgroup.procs may be reused before the signal: pin each process with a pidfd, then signal
        # only those still listed, so a process that took over a number in the meantime is never hit.
        pidfds: dict[int, int | None] = {}
        try:
            for pid in pids:
                try:
                    pidfds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue
                except OSError:
                    pidfds[pid] = None  # no pidfd (kernel before 5.3, out of fds): plain kill, with its race
            still = set(self.processes())
            for pid, pidfd in pidfds.items():
                if pid not in still:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    if pidfd is None:
                        os.kill(pid, signal.SIGKILL)
                    else:
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            for pidfd in pidfds.values():
                if pidfd is not None:
                    os.close(pidfd)

    def remove(self) -> None:
        """kill_all, then deletes the child cgroups (retrying briefly while they empty); never raises."""
        try:
            self.kill_all()
        except Exception:
            log.exception("egressd-%s: killing its processes failed", self.name)
        deadline = time.monotonic() + _RMDIR_SECONDS
        for directory in self._directories:
            # Deepest first: a cgroup can't be removed while it has children.
            nested = [Path(current) for current, _, _ in os.walk(directory, topdown=False)]
            for cgroup in nested:
                while True:
                    try:
                        cgroup.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError as exc:
                        # EBUSY until the last exiting task has left the cgroup.
                        if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                            log.warning("egressd-%s: cannot remove %s: %s", self.name, cgroup, exc)
                            break
                        time.sleep(0.02)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.remove()


class _Builder:
    """Makes the child cgroups for confine(), and takes them back down if one step fails."""

    def __init__(self, child: str) -> None:
        self.child = child
        self.created: list[Path] = []

    def v2(self, hierarchy: _Hierarchy, controller: str, settings: dict[str, str]) -> Path | None:
        """The v2 child with the controller's settings written, or None if that controller can't be had there."""
        parent = hierarchy.directory
        try:
            if controller not in (parent / "cgroup.controllers").read_text().split():
                return None
            if controller not in (parent / "cgroup.subtree_control").read_text().split():
                # EBUSY when this process's cgroup holds processes ("no internal processes"): not usable then.
                _write(parent / "cgroup.subtree_control", f"+{controller}")
        except OSError:
            return None
        return self._configure(parent, settings)

    def v1(
        self, hierarchy: _Hierarchy, settings: dict[str, str], then: Callable[[Path], None] | None = None
    ) -> Path | None:
        return self._configure(hierarchy.directory, settings, then)

    def _configure(
        self, parent: Path, settings: dict[str, str], then: Callable[[Path], None] | None = None
    ) -> Path | None:
        """The child under parent with settings written; a setting whose name ends in "?" only where the file exists.

        The child is shared by the limits of one hierarchy; it is made by the first and dropped again if that fails.
        """
        directory = parent / self.child
        fresh = directory not in self.created
        if fresh:
            directory.mkdir()  # FileExistsError: another sandbox of that name is running, or one was left behind
            self.created.append(directory)
        try:
            for filename, value in settings.items():
                if filename.endswith("?"):
                    filename = filename[:-1]
                    if not (directory / filename).exists():
                        continue
                _write(directory / filename, value)
            if then is not None:
                then(directory)
        except OSError as exc:
            log.info("egressd-%s: %s not usable: %s", self.child, directory, exc)
            if fresh:
                self.created.remove(directory)
                with contextlib.suppress(OSError):
                    directory.rmdir()
            return None
        return directory

    def undo(self) -> None:
        for directory in reversed(self.created):
            with contextlib.suppress(OSError):
                directory.rmdir()
        self.created.clear()


def _oom_killer_on(directory: Path) -> None:
    """Turns the OOM killer on in a v1 memory cgroup, which inherits oom_kill_disable from its parent.

    With it off, a sandbox at its cap would hang rather than be killed. Written only when needed, since the kernel
    logs writing memory.oom_control as deprecated.
    """
    if _read_keyed(directory / "memory.oom_control").get("oom_kill_disable", 0):
        _write(directory / "memory.oom_control", "0")


def confine(name: str, limits: Limits) -> Confinement:
    """Creates the child cgroups named `egressd-<name>` under this process's own cgroup in each hierarchy, with the
    limits set; falls back per limit to rlimit when a controller is missing or not writable.

    Raises ValueError for a name outside [A-Za-z0-9_-], FileExistsError when such a cgroup already exists.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"confinement name must be [A-Za-z0-9_-]+, not {name!r}")
    try:
        hierarchies = _hierarchies()
    except OSError as exc:
        log.info("cgroups not readable, falling back to rlimits: %s", exc)
        hierarchies = {}
    settings = {
        # Swap is capped too where it is accounted, or the sandbox could go on past its cap in swap.
        "memory": (
            {"memory.max": str(limits.memory_bytes), "memory.swap.max?": "0"},
            {
                "memory.limit_in_bytes": str(limits.memory_bytes),
                "memory.memsw.limit_in_bytes?": str(limits.memory_bytes),
            },
        ),
        "pids": ({"pids.max": str(limits.pids)}, {"pids.max": str(limits.pids)}),
    }
    then = {"memory": _oom_killer_on}
    builder = _Builder(f"egressd-{name}")
    mechanisms: dict[str, str] = {}
    cgroups: dict[str, Path] = {}
    try:
        for controller, (settings_v2, settings_v1) in settings.items():
            mechanisms[controller] = RLIMIT
            v2, v1 = hierarchies.get(""), hierarchies.get(controller)
            if v2 is not None and (directory := builder.v2(v2, controller, settings_v2)) is not None:
                mechanisms[controller], cgroups[controller] = CGROUP_V2, directory
            elif v1 is not None and (directory := builder.v1(v1, settings_v1, then.get(controller))) is not None:
                mechanisms[controller], cgroups[controller] = CGROUP_V1, directory
    except BaseException:
        builder.undo()
        raise
    return Confinement(name, limits, mechanisms, cgroups)
