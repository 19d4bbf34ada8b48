"""The daemon's configuration: a TOML file where every key is optional and unknown keys are refused."""

import ipaddress
import tomllib
from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from egressd.addresses import parse_cidrs
from egressd.policy import SECRET_NAME_PATTERN

DEFAULT_CONFIG_NAME = "egressd.toml"


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file, the key's path and why."""


def parse_hostport(value: str, default_port: int | None) -> tuple[str, int]:
    """'IP', 'IP:PORT' or '[IPv6]:PORT' → (ip, port); only IP literals, so nothing here needs DNS."""
    host, port = value, default_port
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{value!r} is not IP, IP:PORT or [IPv6]:PORT")
        if rest:
            port = _port(rest[1:], value)
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
        port = _port(port_text, value)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{value!r} does not start with an IP address") from None
    if port is None:
        raise ValueError(f"{value!r} has no port")
    return str(ip), port


def _port(text: str, value: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise ValueError(f"{value!r} has no valid port (1-65535)")
    return int(text)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ProxyConfig(_Section):
    listen: Annotated[list[str], Field(min_length=1)] = ["127.0.0.1:3128"]

    @field_validator("listen")
    @classmethod
    def _listen(cls, values: list[str]) -> list[str]:
        for value in values:
            parse_hostport(value, None)
        return values

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [parse_hostport(value, None) for value in self.listen]


class ControlConfig(_Section):
    socket: str = "var/control.sock"
    mode: str = "0600"  # "0660" lets the daemon's group (admins) mint tokens; never wider

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        if value not in ("0600", "0660"):
            raise ValueError("must be '0600' (the daemon's user only) or '0660' (and its group)")
        return value

    @property
    def permissions(self) -> int:
        return int(self.mode, 8)


class MetricsConfig(_Section):
    listen: str = "127.0.0.1:9464"  # "" disables the endpoint

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        if value:
            parse_hostport(value, None)
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        return parse_hostport(self.listen, None) if self.listen else None


class PathsConfig(_Section):
    policies: str = "policies"
    ca: str = "ca"
    state: str = "var"
    audit_log: str = "var/audit.jsonl"


class DnsConfig(_Section):
    servers: list[str] = []
    timeout: Annotated[float, Field(gt=0, le=60)] = 2.0
    min_ttl: Annotated[int, Field(ge=0)] = 5
    max_ttl: Annotated[int, Field(ge=0)] = 300

    @field_validator("servers")
    @classmethod
    def _servers(cls, values: list[str]) -> list[str]:
        for value in values:
            parse_hostport(value, 53)
        return values

    @field_validator("timeout", mode="before")
    @classmethod
    def _int_is_float(cls, value: object) -> object:
        return float(value) if type(value) is int else value

    @model_validator(mode="after")
    def _ttl_order(self) -> Self:
        if self.min_ttl > self.max_ttl:
            raise ValueError(f"min_ttl ({self.min_ttl}) is greater than max_ttl ({self.max_ttl})")
        return self

    @property
    def server_addresses(self) -> list[tuple[str, int]]:
        return [parse_hostport(value, 53) for value in self.servers]


class UpstreamConfig(_Section):
    ca_file: str = ""
    connect_timeout: Annotated[float, Field(gt=0, le=300)] = 10.0
    allow_cidrs: list[str] = []

    @field_validator("connect_timeout", mode="before")
    @classmethod
    def _int_is_float(cls, value: object) -> object:
        return float(value) if type(value) is int else value

    @field_validator("allow_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        parse_cidrs(values)
        return values

    @property
    def allowed_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return parse_cidrs(self.allow_cidrs)


class SecretSource(_Section):
    """Where an operator secret's value is read from: a file, or a systemd credential (LoadCredential=)."""

    file: str = ""
    credential: str = ""  # a name inside $CREDENTIALS_DIRECTORY

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if bool(self.file) == bool(self.credential):
            raise ValueError("give exactly one of 'file' or 'credential'")
        if self.credential and ("/" in self.credential or self.credential in (".", "..")):
            raise ValueError("'credential' is a name inside $CREDENTIALS_DIRECTORY, not a path")
        return self


class Config(_Section):
    proxy: ProxyConfig = ProxyConfig()
    control: ControlConfig = ControlConfig()
    metrics: MetricsConfig = MetricsConfig()
    paths: PathsConfig = PathsConfig()
    dns: DnsConfig = DnsConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    secrets: dict[Annotated[str, Field(pattern=SECRET_NAME_PATTERN)], SecretSource] = {}
    # Relative paths in the file are relative to the file's own directory (the working directory without one).
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    def path(self, value: str) -> Path:
        return (self.base_dir / value).resolve() if value else Path()


def _error_text(source: str, err: ValidationError) -> str:
    lines = []
    for problem in err.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        why = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            why = "unknown key"
        lines.append(f"{source}: {where}: {why}")
    return "\n".join(lines)


def _toml(text: str, source: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source}: not valid TOML: {err}") from None


def _merge(base: dict[str, object], over: dict[str, object]) -> dict[str, object]:
    """Tables merge key by key; any other value (a list too) replaces the one below it."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        merged[key] = _merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return merged


def parse_config(text: str, source: str, base_dir: Path, drop_ins: list[tuple[str, str]] = ()) -> Config:
    """A config from its text and any drop-ins' (source, text), merged over it in order."""
    data = _toml(text, source)
    for drop_in_source, drop_in_text in drop_ins:
        data = _merge(data, _toml(drop_in_text, drop_in_source))
    if drop_ins:
        source = f"{source} (with {', '.join(name for name, _ in drop_ins)})"
    try:
        config = Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_error_text(source, err)) from None
    config._base_dir = base_dir
    return config


def load_config(path: Path | None) -> Config:
    """The config from `path` with the drop-ins of `<its dir>/conf.d/*.toml` merged over it in name order
    (so admins and tests never edit the file itself); without a path, the defaults relative to the working
    directory."""
    if path is None:
        return Config()
    drop_in_dir = path.resolve().parent / "conf.d"
    files = [path, *sorted(drop_in_dir.glob("*.toml"))] if drop_in_dir.is_dir() else [path]
    texts = []
    for file in files:
        try:
            texts.append((str(file), file.read_text(encoding="utf-8")))
        except OSError as err:
            raise ConfigError(f"{file}: cannot read config: {err.strerror}") from None
    (source, text), *drop_ins = texts
    return parse_config(text, source, path.resolve().parent, drop_ins)
