"""The daemon's TOML config: defaults, every key of the spec, and refusals naming the key's path and why."""

import ipaddress
from pathlib import Path

import pytest

from egressd.config import Config, ConfigError, load_config, parse_config, parse_hostport

SOURCE = "/etc/egressd/egressd.toml"
BASE = Path("/etc/egressd")


def parse(text: str) -> Config:
    return parse_config(text, SOURCE, BASE)


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return str(info.value)


# --- defaults --------------------------------------------------------------------------------------------


def test_empty_file_gives_the_documented_defaults() -> None:
    config = parse("")
    assert config.proxy.listen == ["127.0.0.1:3128"]
    assert config.proxy.addresses == [("127.0.0.1", 3128)]
    assert config.control.socket == "var/control.sock"
    assert config.paths.policies == "policies"
    assert config.paths.ca == "ca"
    assert config.paths.state == "var"
    assert config.paths.audit_log == "var/audit.jsonl"
    assert config.dns.servers == []
    assert config.dns.server_addresses == []
    assert config.dns.timeout == 2.0
    assert config.dns.min_ttl == 5
    assert config.dns.max_ttl == 300
    assert config.upstream.ca_file == ""
    assert config.upstream.connect_timeout == 10.0
    assert config.upstream.allow_cidrs == []
    assert config.upstream.allowed_networks == ()
    assert config.base_dir == BASE


def test_defaults_without_a_file_are_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None)
    assert config == parse_config("", "x", tmp_path)
    assert config.path(config.paths.state) == tmp_path.resolve() / "var"
    assert config.path(config.paths.policies) == tmp_path.resolve() / "policies"


def test_spec_example_with_every_key() -> None:
    config = parse(
        """
[proxy]
listen = ["127.0.0.1:3128", "[::1]:3129", "0.0.0.0:8080"]
[control]
socket = "/run/egressd/control.sock"
[paths]
policies = "/etc/egressd/policies"
ca = "/var/lib/egressd/ca"
state = "/var/lib/egressd"
audit_log = "-"
[dns]
servers = ["9.9.9.9", "127.0.0.53:5353", "[2620:fe::fe]:53", "2620:fe::9"]
timeout = 1
min_ttl = 0
max_ttl = 60
[upstream]
ca_file = "extra.pem"
connect_timeout = 2.5
allow_cidrs = ["127.0.0.10/32", "10.0.0.0/8", "fd00::/8", "127.0.0.11"]
"""
    )
    assert config.proxy.addresses == [("127.0.0.1", 3128), ("::1", 3129), ("0.0.0.0", 8080)]
    assert config.control.socket == "/run/egressd/control.sock"
    assert config.paths.policies == "/etc/egressd/policies"
    assert config.paths.ca == "/var/lib/egressd/ca"
    assert config.paths.state == "/var/lib/egressd"
    assert config.paths.audit_log == "-"
    assert config.dns.server_addresses == [
        ("9.9.9.9", 53),
        ("127.0.0.53", 5353),
        ("2620:fe::fe", 53),
        ("2620:fe::9", 53),
    ]
    assert config.dns.timeout == 1.0
    assert isinstance(config.dns.timeout, float)
    assert (config.dns.min_ttl, config.dns.max_ttl) == (0, 60)
    assert config.upstream.ca_file == "extra.pem"
    assert config.upstream.connect_timeout == 2.5
    assert config.upstream.allowed_networks == (
        ipaddress.ip_network("127.0.0.10/32"),
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
        ipaddress.ip_network("127.0.0.11/32"),
    )


def test_integer_timeouts_are_floats() -> None:
    config = parse("[dns]\ntimeout = 3\n[upstream]\nconnect_timeout = 20\n")
    assert config.dns.timeout == 3.0
    assert config.upstream.connect_timeout == 20.0


def test_equal_ttl_bounds_are_fine() -> None:
    assert parse("[dns]\nmin_ttl = 30\nmax_ttl = 30\n").dns.max_ttl == 30


# --- refusals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("colour = 1", "colour"),
        ("[logging]\nlevel = 'debug'", "logging"),
        ("[proxy]\nport = 3128", "proxy.port"),
        ("[control]\nowner = 'root'", "control.owner"),
        ("[paths]\nlogs = 'x'", "paths.logs"),
        ("[dns]\nserver = ['1.1.1.1']", "dns.server"),
        ("[upstream]\nallow_cidr = []", "upstream.allow_cidr"),
    ],
)
def test_unknown_key_is_refused_with_its_path(text: str, where: str) -> None:
    assert refusal(text) == f"{SOURCE}: {where}: unknown key"


def test_base_dir_cannot_be_set_from_the_file() -> None:
    assert refusal('base_dir = "/"').startswith(f"{SOURCE}: base_dir: ")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("proxy = 3", "proxy"),
        ("[proxy]\nlisten = '127.0.0.1:3128'", "proxy.listen"),
        ("[proxy]\nlisten = [3128]", "proxy.listen.0"),
        ("[control]\nsocket = 1", "control.socket"),
        ("[paths]\npolicies = ['a']", "paths.policies"),
        ("[paths]\nca = true", "paths.ca"),
        ("[paths]\nstate = 0", "paths.state"),
        ("[paths]\naudit_log = 1", "paths.audit_log"),
        ("[dns]\nservers = '1.1.1.1'", "dns.servers"),
        ("[dns]\ntimeout = '2'", "dns.timeout"),
        ("[dns]\ntimeout = true", "dns.timeout"),
        ("[dns]\nmin_ttl = '5'", "dns.min_ttl"),
        ("[dns]\nmin_ttl = 5.0", "dns.min_ttl"),
        ("[dns]\nmin_ttl = true", "dns.min_ttl"),
        ("[dns]\nmax_ttl = 1.5", "dns.max_ttl"),
        ("[upstream]\nca_file = 1", "upstream.ca_file"),
        ("[upstream]\nconnect_timeout = '10'", "upstream.connect_timeout"),
        ("[upstream]\nallow_cidrs = '10.0.0.0/8'", "upstream.allow_cidrs"),
    ],
)
def test_wrong_type_is_refused_with_the_key_path(text: str, where: str) -> None:
    assert refusal(text).startswith(f"{SOURCE}: {where}: ")


@pytest.mark.parametrize(
    ("text", "where", "why"),
    [
        ("[dns]\ntimeout = 0", "dns.timeout", "greater than 0"),
        ("[dns]\ntimeout = -1.0", "dns.timeout", "greater than 0"),
        ("[dns]\ntimeout = 61", "dns.timeout", "less than or equal to 60"),
        ("[dns]\ntimeout = nan", "dns.timeout", ""),
        ("[dns]\nmin_ttl = -1", "dns.min_ttl", "greater than or equal to 0"),
        ("[dns]\nmax_ttl = -1", "dns.max_ttl", "greater than or equal to 0"),
        ("[upstream]\nconnect_timeout = 0", "upstream.connect_timeout", "greater than 0"),
        ("[upstream]\nconnect_timeout = inf", "upstream.connect_timeout", ""),
        ("[proxy]\nlisten = []", "proxy.listen", "at least 1"),
    ],
)
def test_bad_value_is_refused_with_the_key_path(text: str, where: str, why: str) -> None:
    message = refusal(text)
    assert message.startswith(f"{SOURCE}: {where}: ")
    assert why in message


def test_min_ttl_above_max_ttl_is_refused() -> None:
    message = refusal("[dns]\nmin_ttl = 301\n")
    assert message == f"{SOURCE}: dns: min_ttl (301) is greater than max_ttl (300)"
    assert "min_ttl (10) is greater than max_ttl (5)" in refusal("[dns]\nmin_ttl = 10\nmax_ttl = 5\n")


@pytest.mark.parametrize(
    ("listen", "why"),
    [
        ("localhost:3128", "does not start with an IP address"),
        ("egressd.example:3128", "does not start with an IP address"),
        ("127.0.0.1", "has no port"),
        ("::1", "has no port"),
        ("[::1]", "has no port"),
        ("127.0.0.1:0", "no valid port"),
        ("127.0.0.1:65536", "no valid port"),
        ("127.0.0.1:-1", "no valid port"),
        ("127.0.0.1:http", "no valid port"),
        ("127.0.0.1:", "no valid port"),
        ("[::1]3128", "is not IP, IP:PORT or [IPv6]:PORT"),
        ("[::1:3128", "is not IP, IP:PORT or [IPv6]:PORT"),
        ("127.0.0.256:3128", "does not start with an IP address"),
        ("", "does not start with an IP address"),
    ],
)
def test_bad_listen_is_refused(listen: str, why: str) -> None:
    message = refusal(f'[proxy]\nlisten = ["127.0.0.1:3128", "{listen}"]\n')
    assert message.startswith(f"{SOURCE}: proxy.listen: ")
    assert why in message


@pytest.mark.parametrize("server", ["dns.google", "1.1.1.1:0", "[::1]x", "1.1.1.1:53:53", ""])
def test_bad_dns_server_is_refused(server: str) -> None:
    assert refusal(f'[dns]\nservers = ["{server}"]\n').startswith(f"{SOURCE}: dns.servers: ")


@pytest.mark.parametrize(
    ("cidr", "why"),
    [
        ("10.0.0.1/8", "host bits set"),
        ("10.0.0.0/33", "not a valid CIDR"),
        ("not-a-network", "not a valid CIDR"),
        ("fe80::/10%eth0", "zone ids"),
        ("", "not a valid CIDR"),
    ],
)
def test_bad_cidr_is_refused(cidr: str, why: str) -> None:
    message = refusal(f'[upstream]\nallow_cidrs = ["127.0.0.0/8", "{cidr}"]\n')
    assert message.startswith(f"{SOURCE}: upstream.allow_cidrs: ")
    assert why in message


def test_non_string_cidr_is_refused() -> None:
    assert refusal("[upstream]\nallow_cidrs = [167772160]\n").startswith(f"{SOURCE}: upstream.allow_cidrs")


@pytest.mark.parametrize("text", ["[proxy", "listen = ", "[dns]\ntimeout = 2.0\ntimeout = 3.0", "a = 'b"])
def test_bad_toml_is_refused(text: str) -> None:
    assert refusal(text).startswith(f"{SOURCE}: not valid TOML: ")


def test_every_problem_is_listed() -> None:
    lines = refusal("[dns]\nmin_ttl = 'x'\nbogus = 1\n[proxy]\nlisten = ['nowhere']\n").splitlines()
    assert sorted(line.split(": ")[1] for line in lines) == ["dns.bogus", "dns.min_ttl", "proxy.listen"]


# --- files and paths -------------------------------------------------------------------------------------


def test_relative_paths_resolve_against_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc" / "egressd"
    conf_dir.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    file = conf_dir / "egressd.toml"
    file.write_text(
        '[paths]\npolicies = "pol"\nstate = "../state"\naudit_log = "/var/log/egressd.jsonl"\n'
        '[upstream]\nca_file = "certs/extra.pem"\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(elsewhere)
    config = load_config(Path("../etc/egressd/egressd.toml"))
    conf_dir = conf_dir.resolve()
    assert config.base_dir == conf_dir
    assert config.path(config.paths.policies) == conf_dir / "pol"
    assert config.path(config.paths.state) == conf_dir.parent / "state"
    assert config.path(config.paths.ca) == conf_dir / "ca"
    assert config.path(config.control.socket) == conf_dir / "var" / "control.sock"
    assert config.path(config.paths.audit_log) == Path("/var/log/egressd.jsonl")
    assert config.path(config.upstream.ca_file) == conf_dir / "certs" / "extra.pem"


def test_empty_path_stays_empty() -> None:
    assert parse("").path("") == Path()


def test_unreadable_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")


def test_load_config_names_the_file_in_errors(tmp_path: Path) -> None:
    file = tmp_path / "egressd.toml"
    file.write_text("[dns]\nmin_ttl = -5\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert str(info.value).startswith(f"{file}: dns.min_ttl: ")


def test_config_is_immutable() -> None:
    config = parse("")
    with pytest.raises(ValueError, match="frozen"):
        config.dns.min_ttl = 0  # type: ignore[misc]


# --- parse_hostport ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "default", "expected"),
    [
        ("1.2.3.4", 53, ("1.2.3.4", 53)),
        ("1.2.3.4:5353", 53, ("1.2.3.4", 5353)),
        ("::1", 53, ("::1", 53)),
        ("[::1]", 53, ("::1", 53)),
        ("[::1]:5353", None, ("::1", 5353)),
        ("[0:0::1]:5353", None, ("::1", 5353)),
        ("127.0.0.1:1", None, ("127.0.0.1", 1)),
        ("127.0.0.1:65535", None, ("127.0.0.1", 65535)),
    ],
)
def test_parse_hostport(value: str, default: int | None, expected: tuple[str, int]) -> None:
    assert parse_hostport(value, default) == expected


# --- drop-ins and the control socket's mode ---------------------------------------------------------------

def test_drop_ins_merge_over_the_file_in_name_order(tmp_path: Path) -> None:
    main = tmp_path / "egressd.toml"
    main.write_text('[proxy]\nlisten = ["127.0.0.1:3128"]\n[dns]\ntimeout = 3.0\nmin_ttl = 1\n')
    drop_ins = tmp_path / "conf.d"
    drop_ins.mkdir()
    (drop_ins / "20-late.toml").write_text('[dns]\ntimeout = 5.0\n')
    (drop_ins / "10-early.toml").write_text('[dns]\ntimeout = 4.0\n[upstream]\nallow_cidrs = ["127.0.0.8/29"]\n')
    (drop_ins / "ignored.conf").write_text("not toml at all")
    config = load_config(main)
    assert config.dns.timeout == 5.0 and config.dns.min_ttl == 1
    assert config.upstream.allow_cidrs == ["127.0.0.8/29"]
    assert config.proxy.listen == ["127.0.0.1:3128"]


def test_a_bad_drop_in_is_named(tmp_path: Path) -> None:
    (tmp_path / "egressd.toml").write_text("")
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "50-bad.toml").write_text("[dns]\nbogus = 1\n")
    with pytest.raises(ConfigError, match=r"50-bad\.toml.*dns\.bogus: unknown key"):
        load_config(tmp_path / "egressd.toml")


@pytest.mark.parametrize(("mode", "ok"), [("0600", True), ("0660", True), ("0666", False), ("600", False)])
def test_control_socket_mode(mode: str, ok: bool) -> None:
    text = f'[control]\nmode = "{mode}"\n'
    if ok:
        assert parse_config(text, "c.toml", Path("/")).control.permissions == int(mode, 8)
    else:
        with pytest.raises(ConfigError, match=r"control\.mode"):
            parse_config(text, "c.toml", Path("/"))
