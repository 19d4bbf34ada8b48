"""The Debian package's files (packaging/deb/), checked without building it.

The unit has every directive the issue asks for, passes `systemd-analyze verify` and rates at most 2.0 ("OK") in
`systemd-analyze security --offline=yes`; the conffile is a config egressd itself accepts; the example policy is a
valid policy once uncommented and is not loaded as it ships; the man page and /usr/bin/egressd know every
subcommand of the real CLI; every lintian override says why. systemd-analyze comes from the Debian package
`systemd`: without it these tests skip, and under CI=true they fail.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from egressd.cli import _parser
from egressd.config import load_config
from egressd.policy import parse_policy

REPO = Path(__file__).resolve().parents[2]
DEB = REPO / "packaging" / "deb"
UNIT = DEB / "egressd.service"
CONFFILE = DEB / "egressd.toml"
MAX_EXPOSURE = 2.0


def unit_settings(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of every setting, in order; comments and blank lines left out."""
    settings, section = [], ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a setting: {line!r}"
        settings.append((section, key.strip(), value.strip()))
    return settings


def service(key: str) -> list[str]:
    return [value for section, name, value in unit_settings(UNIT.read_text()) if section == "Service" and name == key]


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        message = "systemd-analyze is missing (apt-get install systemd)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def cli_commands() -> set[tuple[str, ...]]:
    """The words of every leaf subcommand of the real `egressd` parser, e.g. ("token", "mint")."""

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> set[tuple[str, ...]]:
        subparsers = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        if not subparsers:
            return {words}
        found: set[tuple[str, ...]] = set()
        for name, sub in subparsers[0].choices.items():
            found |= walk(sub, (*words, name))
        return found

    return walk(_parser(), ())


def launcher() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("egressd_deb_launcher", str(DEB / "egressd.py"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


# --- the systemd unit ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("User", "egressd"),
        ("Group", "egressd"),
        ("ExecStart", "/usr/bin/egressd serve --config /etc/egressd/egressd.toml"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("Restart", "on-failure"),
        ("StateDirectory", "egressd"),
        ("StateDirectoryMode", "0750"),
        ("RuntimeDirectory", "egressd"),
        ("RuntimeDirectoryMode", "0750"),
        ("LogsDirectory", "egressd"),
        ("LogsDirectoryMode", "0750"),
        ("ConfigurationDirectory", "egressd"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("SystemCallFilter", "@system-service"),
        ("SystemCallArchitectures", "native"),
    ],
)
def test_unit_has_directive(key: str, value: str) -> None:
    assert value in service(key), f"{UNIT.name}: want {key}={value}, have {service(key)}"


def test_capability_sets_stay_empty() -> None:
    assert service("CapabilityBoundingSet") == [""]
    assert service("AmbientCapabilities") == [""]


def test_unit_never_restricts_the_upstream_network() -> None:
    """egressd must reach any public upstream: no IP allow/deny lists, no private network."""
    for key in ("IPAddressDeny", "IPAddressAllow", "PrivateNetwork", "RestrictNetworkInterfaces"):
        assert service(key) in ([], ["no"]), f"{key}= would cut egressd off from upstreams"


def test_unit_documents_load_credential_for_secrets() -> None:
    text = UNIT.read_text()
    assert re.search(r"^#\s*LoadCredential=\S+:/\S+", text, re.MULTILINE), "a commented LoadCredential= example"
    assert "CREDENTIALS_DIRECTORY" in text and "credential =" in text


def test_unit_verifies(tmp_path: Path) -> None:
    """systemd-analyze verify, with ExecStart pointing at a stand-in for /usr/bin/egressd (not installed here)."""
    analyze = systemd_analyze()
    stand_in = tmp_path / "egressd"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    unit = tmp_path / "egressd.service"
    unit.write_text(UNIT.read_text().replace("ExecStart=/usr/bin/egressd ", f"ExecStart={stand_in} "))
    done = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (done.stdout + done.stderr).splitlines() if "egressd" in line]
    assert done.returncode == 0 and not problems, done.stdout + done.stderr


def test_unit_security_exposure_is_ok() -> None:
    analyze = systemd_analyze()
    done = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(UNIT)],
                          capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for egressd\.service: (\d+(?:\.\d+)?)", done.stdout)
    assert match, f"no overall exposure level (exit {done.returncode}):\n{done.stdout}{done.stderr}"
    assert float(match.group(1)) <= MAX_EXPOSURE, done.stdout


# --- the conffile, its drop-ins and the example policy ---------------------------------------------------------------


def installed_config(tmp_path: Path, conffile_text: str | None = None) -> Path:
    """The conffile and conf.d/README laid out as the package installs them."""
    etc = tmp_path / "etc" / "egressd"
    (etc / "conf.d").mkdir(parents=True)
    (etc / "egressd.toml").write_text(conffile_text if conffile_text is not None else CONFFILE.read_text())
    shutil.copyfile(DEB / "conf.d-README", etc / "conf.d" / "README")
    return etc / "egressd.toml"


def test_conffile_is_a_valid_config_with_the_package_paths(tmp_path: Path) -> None:
    config = load_config(installed_config(tmp_path))
    assert config.proxy.listen == ["127.0.0.1:3128"]
    assert config.control.socket == "/run/egressd/control.sock"
    assert config.control.mode == "0660"
    assert config.metrics.listen == "127.0.0.1:9464"
    assert config.paths.policies == "/etc/egressd/policies"
    assert config.paths.ca == "/var/lib/egressd/ca"
    assert config.paths.state == "/var/lib/egressd"
    assert config.paths.audit_log == "/var/log/egressd/audit.jsonl"
    assert config.secrets == {}


def test_conffile_shows_how_to_listen_on_the_sandbox_network() -> None:
    assert re.search(r'^#.*listen = \["127\.0\.0\.1:3128", "\d+\.\d+\.\d+\.\d+:3128"\]', CONFFILE.read_text(),
                     re.MULTILINE)


def test_conffile_secret_example_is_valid_once_uncommented(tmp_path: Path) -> None:
    lines = CONFFILE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#[secrets."))
    uncommented = [line.removeprefix("#") if i >= start else line for i, line in enumerate(lines)]
    config = load_config(installed_config(tmp_path, "\n".join(uncommented) + "\n"))
    assert [(source.credential, source.file) for source in config.secrets.values()] == [("github-token", "")]


def test_drop_ins_merge_over_the_conffile(tmp_path: Path) -> None:
    path = installed_config(tmp_path)
    (path.parent / "conf.d" / "50-test.toml").write_text('[proxy]\nlisten = ["127.0.0.1:3129"]\n')
    config = load_config(path)
    assert config.proxy.listen == ["127.0.0.1:3129"]
    assert config.paths.state == "/var/lib/egressd"


def test_example_policy_is_valid_and_inactive_until_renamed() -> None:
    example = DEB / "example.toml.example"
    assert not example.name.endswith(".toml"), "policies/*.toml would load it"
    policy = parse_policy(example.read_text(), str(example))
    assert (policy.name, policy.version) == ("example", 1)


def test_example_policy_secret_and_open_web_parts_are_valid_once_uncommented() -> None:
    example = DEB / "example.toml.example"
    lines = example.read_text().splitlines()
    uncommented = [line[1:] if re.match(r"#\[|#[a-z_]+ = ", line) else line for line in lines]
    assert uncommented != lines
    policy = parse_policy("\n".join(uncommented), str(example))
    assert policy.name == "example"


# --- the command, the man page -------------------------------------------------------------------------------------


def test_launcher_runs_isolated_from_host_site_packages() -> None:
    first = (DEB / "egressd.py").read_text().splitlines()[0]
    assert first == "#!/usr/bin/python3 -IS"
    assert launcher().LIBDIR == "/usr/lib/egressd"


def test_launcher_knows_every_subcommand() -> None:
    assert launcher().LEAVES == cli_commands()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["token", "mint", "--policy", "p"], ["token", "mint", "--config", "CFG", "--policy", "p"]),
        (["serve"], ["serve", "--config", "CFG"]),
        (["run", "--policy", "p", "--", "sh", "--config", "x"],
         ["run", "--config", "CFG", "--policy", "p", "--", "sh", "--config", "x"]),
        (["token", "list", "--config", "other.toml"], ["token", "list", "--config", "other.toml"]),
        (["token", "list", "--config=other.toml"], ["token", "list", "--config=other.toml"]),
        (["token", "list", "--conf", "other.toml"], ["token", "list", "--conf", "other.toml"]),
        (["--version"], ["--version"]),
        (["ca"], ["ca"]),
        ([], []),
    ],
)
def test_launcher_defaults_to_the_package_config(tmp_path: Path, argv: list[str], expected: list[str]) -> None:
    config = tmp_path / "egressd.toml"
    config.write_text("")
    assert launcher().with_default_config(argv, str(config)) == [str(config) if a == "CFG" else a for a in expected]
    assert launcher().with_default_config(argv, str(tmp_path / "absent.toml")) == argv


def test_man_page_synopsis_has_every_subcommand() -> None:
    text = (DEB / "egressd.8").read_text()
    synopsis = text.split(".SH SYNOPSIS", 1)[1].split("\n.SH ", 1)[0]
    lines = [line.removeprefix(".B ").replace("\\-", "-") for line in synopsis.splitlines() if line.startswith(".B ")]
    for words in cli_commands():
        assert f"egressd {' '.join(words)}" in lines, f"SYNOPSIS lacks egressd {' '.join(words)}"
    assert "egressd --version" in lines
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "FILES", "SIGNALS", "SEE ALSO"):
        assert f"\n.SH {section}\n" in text


# --- logrotate, maintainer scripts, lintian overrides, the build script --------------------------------------------


def test_logrotate_renames_and_signals_instead_of_truncating() -> None:
    text = (DEB / "logrotate").read_text()
    directives = [line.strip() for line in text.splitlines() if not line.strip().startswith("#")]
    assert not any("copytruncate" in line for line in directives)
    assert "su egressd egressd" in directives
    assert "create 0640 egressd egressd" in directives
    assert "systemctl kill --signal=USR1 --kill-whom=main egressd.service" in text
    assert "kill -USR1" in text  # without systemd


@pytest.mark.parametrize("script", ["postinst", "prerm", "postrm"])
def test_maintainer_script_is_plain_posix_sh(script: str) -> None:
    path = DEB / script
    text = path.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "\nset -e\n" in text
    assert "#DEBHELPER#" not in text
    assert os.access(path, os.X_OK), f"{script} is not executable"
    shell = shutil.which("dash") or shutil.which("sh")
    assert shell is not None
    done = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_postinst_creates_the_user_and_never_the_ca() -> None:
    text = (DEB / "postinst").read_text()
    assert "adduser --system --group --home /var/lib/egressd --no-create-home --quiet egressd" in text
    assert "python3 -I -m compileall -q /usr/lib/egressd" in text
    assert "ca" not in re.findall(r"/var/lib/egressd/(\w+)", text)


def test_postrm_purges_state_logs_and_config_but_keeps_the_user() -> None:
    text = (DEB / "postrm").read_text()
    purge = text.split('if [ "$1" = purge ]; then', 1)[1]
    assert "rm -rf /var/lib/egressd /var/log/egressd /run/egressd /etc/egressd" in purge
    assert "deluser" not in text and "userdel" not in text


def test_every_lintian_override_has_a_reason() -> None:
    lines = (DEB / "lintian-overrides").read_text().splitlines()
    overrides = [i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")]
    assert overrides
    for i in overrides:
        assert lines[i].startswith("egressd: "), f"line {i + 1}: {lines[i]!r}"
        assert i > 0 and lines[i - 1].startswith("# ") and len(lines[i - 1]) > 10, f"line {i + 1} has no reason"


def test_build_script_uses_only_tracked_inputs() -> None:
    """Everything build.sh installs from packaging/deb exists there; from the repo it reads only these."""
    text = (DEB / "build.sh").read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    names = set(re.findall(r'"\$here/([\w-][\w.-]*)"', text))
    assert {"egressd.service", "egressd.toml", "control.in", "lintian-overrides"} <= names
    for name in names:
        assert (DEB / name).is_file(), f"build.sh uses packaging/deb/{name}, which is missing"
    assert set(re.findall(r'"\$repo/([^"$]+)"', text)) <= {"egressd/__init__.py", "pyproject.toml", "README.md", "dist"}
    done = subprocess.run(["bash", "-n", str(DEB / "build.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
