"""egressd's Debian package, installed for real: scripts/deb-test builds it, lints it and installs it with apt in a
fresh Debian 13 (trixie) minbase root; these tests take it from there, in order, inside a network namespace with
nothing but loopback: the installed layout and the unit; `egressd serve` in the root as user egressd, started the
way egressd.service would start it (there is no systemd inside); a token minted over the control socket as root and
a request through the daemon to an HTTPS upstream of the test's own on loopback (opened by a drop-in in
/etc/egressd/conf.d/, never by editing the conffile); the audit line and the CA key; then an upgrade to a rebuild
with a higher version, a remove and a purge.

The root shares this network namespace, so the daemon in it reaches the test's DNS server and upstream on 127.x.
"""

import contextlib
import hashlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support.dns_server import ScriptedDNS
from tests.support.egressd_process import curl_path
from tests.support.upstream import HttpsUpstream, make_test_ca, write_ca_pem

pytestmark = pytest.mark.deb

CONFIG = "/etc/egressd/egressd.toml"
UNIT_DIRS = ("usr/lib/systemd/system", "lib/systemd/system")
CA_KEY = "var/lib/egressd/ca/mitmproxy-ca.pem"
CA_CERT = "var/lib/egressd/ca/mitmproxy-ca-cert.pem"
AUDIT_LOG = "var/log/egressd/audit.jsonl"
CONTROL_SOCKET = "run/egressd/control.sock"
PROXY = ("127.0.0.1", 3128)
# What the test adds to the root, as an admin would: a drop-in, a CA for its upstream, a policy.
DROP_IN = "etc/egressd/conf.d/50-test.toml"
TEST_CA = "etc/egressd/test-ca.pem"
POLICY_FILE = "etc/egressd/policies/deb-test.toml"
POLICY_NAME = "deb-test"
HOST = "api.example.test"
UPSTREAM_IP = "127.0.0.10"

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT = 60.0  # the first start byte-compiles nothing (done at install) but makes the CA
STOP_TIMEOUT = 30.0  # TimeoutStopSec=
DPKG_TIMEOUT = 300.0

POLICY = f"""
name = "{POLICY_NAME}"
version = 1
description = "the Debian package test"

[[allow]]
host = "{HOST}"
reason = "the test's own HTTPS upstream on loopback"
"""


# --------------------------------------------------------------------------------------------------- helpers
def in_root(root: Path, *argv: str, timeout: float = 120.0, check: bool = True,
            userspec: str | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` run in the root as root (or as `userspec` UID:GID), like an admin's shell there; never a prompt."""
    command = ["chroot"]
    if userspec is not None:
        command += [f"--userspec={userspec}", f"--groups={userspec.split(':')[1]}"]
    env = {"PATH": SYSTEM_PATH, "HOME": "/root", "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run([*command, str(root), *argv], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"`{shlex.join(argv)}` in the root exited {done.returncode}:\n"
                             f"{done.stdout}{done.stderr}")
    return done


def package_status(root: Path) -> str:
    """dpkg's 'VERSION STATUS' for egressd ('0.1.0-1 ii'), or '' when dpkg no longer knows it."""
    done = in_root(root, "dpkg-query", "-W", "-f", "${Version} ${db:Status-Abbrev}", "egressd", check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def account(root: Path, name: str) -> tuple[int, int, str, str] | None:
    """(uid, gid, home, shell) of `name` in the root's /etc/passwd."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) == 7 and fields[0] == name:
            return int(fields[2]), int(fields[3]), fields[5], fields[6]
    return None


def group_id(root: Path, name: str) -> int | None:
    for line in (root / "etc/group").read_text().splitlines():
        fields = line.split(":")
        if len(fields) == 4 and fields[0] == name:
            return int(fields[2])
    return None


def supplementary_gids(root: Path, user: str, primary: int) -> list[int]:
    gids = [primary]
    for line in (root / "etc/group").read_text().splitlines():
        fields = line.split(":")
        if len(fields) == 4 and user in fields[3].split(",") and int(fields[2]) not in gids:
            gids.append(int(fields[2]))
    return gids


def egressd_account(root: Path) -> tuple[int, int]:
    found = account(root, "egressd")
    assert found is not None, "no user egressd in the root's /etc/passwd"
    return found[0], found[1]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def describe(path: Path) -> str:
    st = path.stat()
    return f"{path}: mode {stat.S_IMODE(st.st_mode):04o} uid {st.st_uid} gid {st.st_gid}"


def unit_file(root: Path) -> Path:
    for directory in UNIT_DIRS:
        path = root / directory / "egressd.service"
        if path.is_file():
            return path
    raise AssertionError(f"no egressd.service in the root under {' or '.join(UNIT_DIRS)}")


def service_section(path: Path) -> dict[str, list[str]]:
    """The [Service] settings of a unit file: every key's assignments in order (an empty one resets the list)."""
    settings: dict[str, list[str]] = {}
    section = ""
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]" and "=" in line:
            key, _, value = line.partition("=")
            values = settings.setdefault(key.strip(), [])
            if value.strip():
                values.append(value.strip())
            else:
                values.clear()
    return settings


def sha_tree(path: Path) -> dict[str, str]:
    """Every regular file under `path`: relative name → SHA-256 of its bytes (a CA key is never printed)."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def accepts(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=0.3):
            return True
    except OSError:
        return False


def audit_lines(root: Path) -> list[dict]:
    path = root / AUDIT_LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_audit(root: Path, run_id: str, path: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = [a for a in audit_lines(root)
                 if a.get("event") == "request" and a.get("run_id") == run_id and a.get("path") == path]
        if found:
            return found[-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"no audit line for {path} of run {run_id} in {AUDIT_LOG} within {timeout}s; "
                                 f"last lines: {audit_lines(root)[-3:]}")
        time.sleep(0.1)


def curl_via_proxy(root: Path, token: str, url: str, timeout: float = 20.0) -> tuple[int, str, str]:
    """The host's curl through the daemon in the root, trusting its CA: (status, body, curl's stderr)."""
    command = [curl_path(), "-sS", "--noproxy", "", "--max-time", str(timeout),
               "--proxy", f"http://egressd:{token}@{PROXY[0]}:{PROXY[1]}", "--cacert", str(root / CA_CERT),
               "-w", "\n%{http_code}", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 10, check=False)
    body, _, status = done.stdout.rpartition("\n")
    return int(status or 0), body, done.stderr


# ---------------------------------------------------------------------------------------------- the daemon
class UnitStarter:
    """`egressd serve` in the root, started the way systemd would start egressd.service: its ExecStart as its
    User/Group (with that user's groups), its UMask and Environment, a fresh RuntimeDirectory, and the State/Logs/
    Configuration directories made (and handed to the user) when missing. Stopped with SIGTERM, then SIGKILL after
    TimeoutStopSec; the RuntimeDirectory is removed then, as systemd does."""

    def __init__(self, root: Path, log: Path) -> None:
        self.root = root
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def _setting(self, settings: dict[str, list[str]], key: str, default: str = "") -> str:
        values = settings.get(key, [])
        return values[-1] if values else default

    def start(self) -> None:
        assert self.process is None, "the daemon is already running"
        unit = service_section(unit_file(self.root))
        user = self._setting(unit, "User")
        assert user == "egressd", f"egressd.service runs as User={user!r}, expected egressd"
        found = account(self.root, user)
        assert found is not None, f"User={user} is not in the root's /etc/passwd"
        uid, gid, home, shell = found
        group = self._setting(unit, "Group")
        if group:
            named = group_id(self.root, group)
            assert named is not None, f"Group={group} is not in the root's /etc/group"
            gid = named
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "HOME": home, "USER": user,
               "LOGNAME": user, "SHELL": shell, "INVOCATION_ID": secrets.token_hex(16)}
        for kind, base, variable in (("RuntimeDirectory", "run", "RUNTIME_DIRECTORY"),
                                     ("StateDirectory", "var/lib", "STATE_DIRECTORY"),
                                     ("LogsDirectory", "var/log", "LOGS_DIRECTORY"),
                                     ("ConfigurationDirectory", "etc", "CONFIGURATION_DIRECTORY")):
            names = " ".join(unit.get(kind, [])).split()
            mode = int(self._setting(unit, f"{kind}Mode", "0755"), 8)
            for name in names:
                path = self.root / base / name
                if kind == "RuntimeDirectory" and path.exists():
                    shutil.rmtree(path)
                if not path.exists():
                    path.mkdir(parents=True)
                    path.chmod(mode)
                    if kind != "ConfigurationDirectory":
                        os.chown(path, uid, gid)
                elif kind != "ConfigurationDirectory" and path.stat().st_uid != uid:
                    for child in [path, *path.rglob("*")]:
                        os.chown(child, uid, gid, follow_symlinks=False)
            if names:
                env[variable] = ":".join(f"/{base}/{name}" for name in names)
        for assignment in unit.get("Environment", []):
            for word in shlex.split(assignment):
                key, _, value = word.partition("=")
                env[key] = value
        assert not unit.get("EnvironmentFile"), "EnvironmentFile= is not emulated by this test; extend UnitStarter"
        exec_start = unit.get("ExecStart", [])
        assert len(exec_start) == 1, f"expected one ExecStart=, found {exec_start}"
        argv = shlex.split(exec_start[0].lstrip("-@:+!"))
        assert "$" not in exec_start[0] and "%" not in exec_start[0], f"ExecStart= {exec_start[0]!r} has expansions"
        assert argv[:2] == ["/usr/bin/egressd", "serve"] and CONFIG in argv, f"ExecStart={exec_start[0]}"
        umask = int(self._setting(unit, "UMask", "0022"), 8)
        groups = ",".join(str(g) for g in supplementary_gids(self.root, user, gid))
        command = ["chroot", f"--userspec={uid}:{gid}", f"--groups={groups}", str(self.root), *argv]
        socket_path = self.root / CONTROL_SOCKET
        with self.log.open("ab") as log:
            log.write(f"\n--- {shlex.join(command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, umask=umask, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise AssertionError(f"egressd serve exited at start ({code}):\n{self.tail()}")
            if socket_path.exists() and accepts(PROXY):
                return
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"egressd serve was not listening on {PROXY} with {socket_path} within "
                             f"{START_TIMEOUT}s:\n{self.tail()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # anything it left behind
        for name in " ".join(service_section_or_empty(self.root).get("RuntimeDirectory", [])).split():
            shutil.rmtree(self.root / "run" / name, ignore_errors=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def service_section_or_empty(root: Path) -> dict[str, list[str]]:
    try:
        return service_section(unit_file(root))
    except AssertionError:
        return {"RuntimeDirectory": ["egressd"]}  # the unit went with the package; the directory may not have


# ------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def upstream_ca() -> trustme.CA:
    return make_test_ca()


@pytest.fixture(scope="module")
def dns() -> Iterator[ScriptedDNS]:
    with ScriptedDNS(host="127.0.0.53") as server:
        server.add(HOST, UPSTREAM_IP)
        yield server


@pytest.fixture(scope="module")
def upstream(upstream_ca: trustme.CA) -> Iterator[HttpsUpstream]:
    with HttpsUpstream(ip=UPSTREAM_IP, ca=upstream_ca, hostnames=(HOST,), name="deb-upstream") as server:
        yield server


@pytest.fixture(scope="module")
def daemon(deb_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UnitStarter]:
    starter = UnitStarter(deb_root, tmp_path_factory.mktemp("deb") / "egressd.log")
    try:
        yield starter
    finally:
        starter.stop()


@pytest.fixture(scope="module")
def shared() -> dict:
    """What one step leaves for the next: the run minted before the upgrade, snapshots of the state."""
    return {}


# ------------------------------------------------------------------------------------- the installed package
# These run first (pytest runs a module in order), on the package as apt left it; a failure here does not stop the
# lifecycle below.
def test_layout(deb_root: Path) -> None:
    """Where Debian expects things: a python3 -I script, the private library byte-compiled for 3.13, the conffile's
    paths, the system user, /var/lib/egressd 0750 egressd and no CA yet, man page, copyright, logrotate."""
    script = (deb_root / "usr/bin/egressd").read_bytes()
    assert b"python3" in script.splitlines()[0] and b"-I" in script, (
        f"/usr/bin/egressd must run python3 -I (isolated from site-packages): {script[:200]!r}")
    library = deb_root / "usr/lib/egressd"
    assert (library / "egressd/__init__.py").is_file(), "egressd is not in /usr/lib/egressd"
    assert list(library.rglob("*.cpython-313.pyc")), "nothing in /usr/lib/egressd is byte-compiled for 3.13"
    config = tomllib.loads((deb_root / CONFIG.lstrip("/")).read_text())
    assert config["proxy"]["listen"] == [f"{PROXY[0]}:{PROXY[1]}"]
    assert config["control"] == {"socket": "/" + CONTROL_SOCKET, "mode": "0660"}
    assert config["paths"] == {"policies": "/etc/egressd/policies", "ca": "/var/lib/egressd/ca",
                               "state": "/var/lib/egressd", "audit_log": "/" + AUDIT_LOG}
    assert config["metrics"]["listen"] == "127.0.0.1:9464"
    assert (deb_root / "etc/egressd/conf.d").is_dir()
    policies = deb_root / "etc/egressd/policies"
    assert [p.name for p in policies.iterdir()], "no example policy in /etc/egressd/policies"
    assert not list(policies.glob("*.toml")), "the example policy must not be active until renamed"
    uid, gid = egressd_account(deb_root)
    assert uid < 1000, f"egressd is not a system user (uid {uid})"
    assert group_id(deb_root, "egressd") == gid, "egressd's primary group is not the group egressd"
    state = deb_root / "var/lib/egressd"
    assert (state.stat().st_uid, mode_of(state)) == (uid, 0o750), describe(state)
    assert (deb_root / "var/log/egressd").is_dir()
    # The CA is made by the daemon on its first start, never by the maintainer scripts.
    assert not (deb_root / CA_KEY).exists(), "the CA key exists before the daemon ever started"
    assert (deb_root / "usr/share/man/man8/egressd.8.gz").is_file(), "no man page egressd(8)"
    for name in ("copyright", "changelog.Debian.gz"):
        assert (deb_root / "usr/share/doc/egressd" / name).is_file(), f"no /usr/share/doc/egressd/{name}"
    logrotate = deb_root / "etc/logrotate.d/egressd"
    assert logrotate.is_file(), "no logrotate rule"
    rules = [line.split("#")[0].split() for line in logrotate.read_text().splitlines()]
    assert ["copytruncate"] not in rules, "copytruncate can cut audit lines; egressd reopens the log instead"


def test_unit_verifies_and_is_hardened(deb_root: Path) -> None:
    """The unit, checked by trixie's own systemd-analyze: `verify` is clean, `security --offline` at most 2.0."""
    unit = "/" + str(unit_file(deb_root).relative_to(deb_root))
    if not (deb_root / "usr/bin/systemd-analyze").exists():
        pytest.fail("no systemd-analyze in the root: scripts/deb-test installs systemd there after egressd")
    # Documentation=man:egressd(8) is checked by test_layout (there is no man in a minbase root).
    verify = in_root(deb_root, "systemd-analyze", "verify", "--man=no", unit, check=False)
    assert verify.returncode == 0 and not verify.stderr.strip(), (
        f"systemd-analyze verify {unit}:\n{verify.stdout}{verify.stderr}")
    security = in_root(deb_root, "systemd-analyze", "security", "--offline=yes", "--no-pager", unit, check=False)
    lines = [line for line in security.stdout.splitlines() if "Overall exposure level" in line]
    assert lines, f"systemd-analyze security gave no overall level:\n{security.stdout}{security.stderr}"
    level = float(lines[-1].split(":")[1].split()[0])
    assert level <= 2.0, f"exposure {level} is above 2.0 ('OK'):\n{security.stdout}"


# ---------------------------------------------------------------------------------------------------- steps
@pytest.mark.incremental
class TestPackageLifecycle:
    def test_installed_by_apt(self, deb_root: Path) -> None:
        status = package_status(deb_root)
        version, _, abbrev = status.partition(" ")
        assert abbrev == "ii", f"dpkg says egressd is {status!r}"
        built = os.environ.get("EGRESSD_DEB_V1")
        if built:
            field = subprocess.run(["dpkg-deb", "-f", built, "Version"], capture_output=True, text=True, check=True)
            assert version == field.stdout.strip(), f"installed {version}, but {built} is {field.stdout.strip()}"
        upstream_version = version.rsplit("-", 1)[0]
        done = in_root(deb_root, "egressd", "--version")
        assert done.stdout.strip() == f"egressd {upstream_version}"
        fields = in_root(deb_root, "dpkg-query", "-W", "-f", "${Depends}\n${Recommends}\n${Conffiles}\n",
                         "egressd").stdout
        depends, recommends, *conffiles = fields.splitlines()
        for needed in ("python3 (>= 3.13~)", "python3 (<< 3.14)", "ca-certificates"):
            assert needed in depends, f"Depends: {depends}"
        assert "bubblewrap" in recommends, f"Recommends: {recommends}"
        assert any(line.split()[0] == CONFIG for line in conffiles if line.strip()), f"conffiles: {conffiles}"

    def test_serve_mint_and_proxy(self, deb_root: Path, daemon: UnitStarter, dns: ScriptedDNS,
                                  upstream: HttpsUpstream, upstream_ca: trustme.CA, shared: dict) -> None:
        write_ca_pem(upstream_ca, deb_root / TEST_CA).chmod(0o644)
        (deb_root / DROP_IN).write_text(
            "# The Debian package test: its DNS server and its HTTPS upstream on loopback.\n"
            f'[dns]\nservers = ["{dns.server_spec}"]\nmin_ttl = 0\n'
            f'[upstream]\nca_file = "/{TEST_CA}"\nallow_cidrs = ["127.0.0.8/29"]\n')
        (deb_root / POLICY_FILE).write_text(POLICY)
        shared["conffile"] = (deb_root / CONFIG.lstrip("/")).read_bytes()
        uid, gid = egressd_account(deb_root)

        daemon.start()
        key = deb_root / CA_KEY
        assert key.is_file(), f"egressd made no CA key at /{CA_KEY}"
        assert (key.stat().st_uid, mode_of(key)) == (uid, 0o600), describe(key)
        control = deb_root / CONTROL_SOCKET
        assert stat.S_ISSOCK(control.stat().st_mode)
        assert (control.stat().st_uid, control.stat().st_gid, mode_of(control)) == (uid, gid, 0o660), describe(control)

        minted = json.loads(in_root(deb_root, "egressd", "token", "mint", "--config", CONFIG,
                                    "--policy", POLICY_NAME, "--label", "deb-test").stdout)
        assert minted["policy"] == POLICY_NAME and minted["token"], minted
        shared["run"] = minted

        status, body, stderr = curl_via_proxy(deb_root, minted["token"], f"https://{HOST}/from-deb?step=1")
        assert status == 200, f"curl through the daemon: {status} {stderr}\n{body}\n{daemon.tail()}"
        echo = json.loads(body)
        assert echo["path"] == "/from-deb?step=1" and echo["sni"] == HOST
        assert "proxy-authorization" not in echo["headers"]
        assert dns.queried(HOST)
        line = wait_audit(deb_root, minted["run_id"], "/from-deb")
        assert line["decision"] == "allow" and line["reason"] is None, line
        assert (line["host"], line["port"], line["addr"], line["status"]) == (HOST, 443, UPSTREAM_IP, 200), line
        assert line["policy"] == POLICY_NAME, line
        audit = deb_root / AUDIT_LOG
        assert audit.stat().st_uid == uid, describe(audit)
        assert daemon.alive()
        daemon.stop()
        shared["ca"] = sha_tree(deb_root / "var/lib/egressd/ca")

    def test_upgrade_keeps_conffile_state_and_ca(self, deb_root: Path, daemon: UnitStarter, deb_v2: Path,
                                                 dns: ScriptedDNS, upstream: HttpsUpstream, shared: dict) -> None:
        before = package_status(deb_root)
        target = deb_v2
        if deb_root not in deb_v2.resolve().parents:
            target = deb_root / "tmp" / deb_v2.name
            shutil.copyfile(deb_v2, target)
        inside = "/" + str(target.resolve().relative_to(deb_root.resolve()))
        upgraded = in_root(deb_root, "dpkg", "-i", inside, timeout=DPKG_TIMEOUT)
        version = package_status(deb_root).split()[0]
        assert package_status(deb_root).endswith(" ii") and version != before.split()[0], (
            f"{before} → {package_status(deb_root)}:\n{upgraded.stdout}{upgraded.stderr}")
        assert in_root(deb_root, "dpkg", "--compare-versions", version, "gt", before.split()[0],
                       check=False).returncode == 0, f"{version} is not higher than {before}"

        config_dir = deb_root / "etc/egressd"
        assert (config_dir / "egressd.toml").read_bytes() == shared["conffile"], "the upgrade changed the conffile"
        leftovers = [p.name for p in config_dir.rglob("*") if ".dpkg-" in p.name or p.name.endswith(".ucf-dist")]
        assert not leftovers, f"the upgrade left {leftovers}"
        for added in (DROP_IN, TEST_CA, POLICY_FILE):
            assert (deb_root / added).is_file(), f"the upgrade removed /{added}"
        assert sha_tree(deb_root / "var/lib/egressd/ca") == shared["ca"], "the upgrade changed the CA"
        state = deb_root / "var/lib/egressd"
        uid, _ = egressd_account(deb_root)
        assert (state.stat().st_uid, mode_of(state)) == (uid, 0o750), describe(state)
        assert (state / "egressd.db").is_file(), "the upgrade lost the runs database"

        daemon.start()
        run = shared["run"]
        listed = in_root(deb_root, "egressd", "token", "list", "--config", CONFIG).stdout
        assert run["run_id"] in listed, f"the run minted before the upgrade is gone:\n{listed}"
        status, body, stderr = curl_via_proxy(deb_root, run["token"], f"https://{HOST}/after-upgrade")
        assert status == 200, f"the old token after the upgrade: {status} {stderr}\n{body}\n{daemon.tail()}"
        wait_audit(deb_root, run["run_id"], "/after-upgrade")
        assert sha_tree(deb_root / "var/lib/egressd/ca") == shared["ca"], "the daemon replaced the CA"
        daemon.stop()

    def test_remove_keeps_state(self, deb_root: Path, shared: dict) -> None:
        removed = in_root(deb_root, "dpkg", "-r", "egressd", timeout=DPKG_TIMEOUT)
        assert package_status(deb_root).endswith(" rc"), f"{package_status(deb_root)}\n{removed.stdout}"
        assert not (deb_root / "usr/bin/egressd").exists()
        assert not (deb_root / "usr/lib/egressd").exists(), (
            "/usr/lib/egressd is left after remove: " + ", ".join(
                str(p.relative_to(deb_root)) for p in list((deb_root / "usr/lib/egressd").rglob("*"))[:5]))
        assert sha_tree(deb_root / "var/lib/egressd/ca") == shared["ca"], "remove touched the CA"
        assert (deb_root / "var/lib/egressd/egressd.db").is_file(), "remove deleted the state"
        assert (deb_root / CONFIG.lstrip("/")).read_bytes() == shared["conffile"], "remove touched the conffile"
        assert (deb_root / AUDIT_LOG).is_file(), "remove deleted the audit log"

    def test_purge_deletes_everything_but_the_user(self, deb_root: Path) -> None:
        # The test's drop-in, CA and policy stay in /etc/egressd, as an admin's would: purge deletes them too.
        for added in (DROP_IN, TEST_CA, POLICY_FILE):
            assert (deb_root / added).is_file()
        purged = in_root(deb_root, "dpkg", "-P", "egressd", timeout=DPKG_TIMEOUT)
        assert package_status(deb_root).split(" ")[-1] in ("", "un", "pn"), (
            f"dpkg still has egressd as {package_status(deb_root)!r} after purge:\n{purged.stdout}")
        for gone in ("var/lib/egressd", "var/log/egressd", "etc/egressd", "run/egressd"):
            assert not (deb_root / gone).exists(), (
                f"/{gone} is left after purge: {sorted(str(p) for p in (deb_root / gone).rglob('*'))[:10]}\n"
                f"{purged.stdout}{purged.stderr}")
        # Debian policy 9.2.2: a system user is not removed on purge (files it owned may remain elsewhere).
        assert account(deb_root, "egressd") is not None, "purge removed the user egressd"
        assert group_id(deb_root, "egressd") is not None, "purge removed the group egressd"

