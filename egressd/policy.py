"""Policy versions: what a run may reach. Parsing, validation, canonical hashing and rule matching; no I/O."""

import hashlib
import json
import re
import tomllib
from functools import cached_property
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from egressd.hostnames import normalize_host

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
# RFC 9110 token characters: what a method may be made of.
_METHOD = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}$")
_PATH_PATTERN = re.compile(r"^/[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*$")


class PolicyError(ValueError):
    """A policy file that cannot be used; one line per problem: 'file: field: why'."""


class PathPattern:
    """A path pattern: '*' matches within one segment, a trailing '/**' matches any rest (or nothing)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        head, rest_wildcard = pattern, False
        if pattern.endswith("/**"):
            head, rest_wildcard = pattern[:-3], True
        parts = [re.escape(part) for part in head.split("*")]
        regex = "[^/]*".join(parts) + ("(?:/.*)?" if rest_wildcard else "")
        self._regex = re.compile(regex, re.DOTALL)

    def matches(self, path: str) -> bool:
        return self._regex.fullmatch(path) is not None


class Rule(BaseModel):
    """What a matching request may do: methods (None: any), paths (None: any) and WebSocket upgrades."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: Annotated[str, Field(min_length=1, strict=True)]
    methods: tuple[str, ...] | None = None
    paths: tuple[str, ...] | None = None
    websocket: Annotated[bool, Field(strict=True)] = False

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must say why the access is needed")
        return value.strip()

    @field_validator("methods", mode="before")
    @classmethod
    def _methods(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("an empty list allows nothing; leave the key out to allow any method")
        for method in value:
            if not isinstance(method, str) or not _METHOD.fullmatch(method):
                raise ValueError(f"{method!r} is not an HTTP method")
        return tuple(sorted({method.upper() for method in value}))

    @field_validator("paths", mode="before")
    @classmethod
    def _paths(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("an empty list allows nothing; leave the key out to allow any path")
        for path in value:
            if not isinstance(path, str) or not _PATH_PATTERN.fullmatch(path):
                raise ValueError(f"{path!r} is not a path pattern: it starts with '/', has no query or fragment")
            if "**" in path.removesuffix("/**"):
                raise ValueError(f"{path!r}: '**' is only allowed as a trailing '/**'")
            if any(segment in (".", "..") for segment in path.split("/")):
                raise ValueError(f"{path!r} has a dot-segment")
        return tuple(value)

    @cached_property
    def _patterns(self) -> tuple[PathPattern, ...] | None:
        return None if self.paths is None else tuple(PathPattern(path) for path in self.paths)

    def allows_method(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def allows_path(self, path: str) -> bool:
        patterns = self._patterns
        return patterns is None or any(pattern.matches(path) for pattern in patterns)


class AllowRule(Rule):
    host: Annotated[str, Field(strict=True)]

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return normalize_host(value)


SECRET_NAME_PATTERN = r"^[A-Z][A-Z0-9_]{0,63}$"  # noqa: S105 (a name pattern, not a secret)
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")


class SecretBinding(BaseModel):
    """Which hosts a secret may be sent to, and where in a request (None: any header, the path and the query)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=SECRET_NAME_PATTERN, strict=True)]
    hosts: Annotated[tuple[str, ...], Field(min_length=1)]
    where: tuple[str, ...] | None = None

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        return tuple(normalize_host(host) if isinstance(host, str) else host for host in value)

    @field_validator("where", mode="before")
    @classmethod
    def _where(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("an empty list allows nowhere; leave the key out for the default")
        places = []
        for place in value:
            kind, _, header = place.partition(":") if isinstance(place, str) else ("", "", "")
            if place in ("path", "query") or (kind == "header" and (header == "*" or _HEADER_NAME.fullmatch(header))):
                places.append(place.lower() if kind == "header" else place)
            else:
                raise ValueError(f"{place!r} is not a place: use 'header:NAME', 'header:*', 'path' or 'query'")
        return tuple(places)

    def allows_place(self, place: str) -> bool:
        """`place` is 'path', 'query' or 'header:<lower-case name>'."""
        if self.where is None:
            return True
        return place in self.where or (place.startswith("header:") and "header:*" in self.where)


class Policy(BaseModel):
    """One immutable version of a policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN, strict=True)]
    version: Annotated[int, Field(gt=0, strict=True)]
    description: Annotated[str, Field(strict=True)] = ""
    allow: tuple[AllowRule, ...] = ()
    open_web: Rule | None = None
    secret: tuple[SecretBinding, ...] = ()

    @model_validator(mode="after")
    def _reaches_something(self) -> "Policy":
        if not self.allow and self.open_web is None:
            raise ValueError("allows nothing: add an [[allow]] rule or [open_web]")
        allowed = {rule.host for rule in self.allow}
        names = [binding.name for binding in self.secret]
        for index, binding in enumerate(self.secret):
            if names.count(binding.name) > 1:
                raise ValueError(f"secret[{index}].name: {binding.name} is bound more than once")
            for host in binding.hosts:
                if host not in allowed:
                    raise ValueError(
                        f"secret[{index}].hosts: {binding.name} is bound to {host}, which no [[allow]] rule allows"
                    )
        return self

    def binding(self, name: str) -> "SecretBinding | None":
        return next((binding for binding in self.secret if binding.name == name), None)

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.version

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"

    @cached_property
    def sha256(self) -> str:
        """Hash of the canonical content: the same policy however the file is formatted or commented."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @cached_property
    def _rules_by_host(self) -> dict[str, tuple[Rule, ...]]:
        by_host: dict[str, list[Rule]] = {}
        for rule in self.allow:
            by_host.setdefault(rule.host, []).append(rule)
        return {host: tuple(rules) for host, rules in by_host.items()}

    def rules_for(self, host: str) -> tuple[Rule, ...]:
        """The rules that cover a normalized host: its [[allow]] rules, else [open_web], else none."""
        rules = self._rules_by_host.get(host)
        if rules:
            return rules
        return (self.open_web,) if self.open_web is not None else ()


def _problems(source: str, err: ValidationError, data: dict) -> str:
    lines = []
    for problem in err.errors():
        loc = list(problem["loc"])
        where = ""
        for part in loc:
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
        # Name the rule by its host too, so "allow[2].paths" can be found in a long file.
        if len(loc) >= 2 and loc[0] == "allow" and isinstance(loc[1], int):
            rules = data.get("allow")
            if isinstance(rules, list) and loc[1] < len(rules) and isinstance(rules[loc[1]], dict):
                host = rules[loc[1]].get("host")
                if isinstance(host, str) and loc[2:] != ["host"]:
                    where += f" (host {host!r})"
        why = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            why = "unknown key"
        elif problem["type"] == "missing":
            why = "required"
        lines.append(f"{source}: {where}: {why}" if where else f"{source}: {why}")
    return "\n".join(lines)


def parse_policy(text: str, source: str) -> Policy:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise PolicyError(f"{source}: not valid TOML: {err}") from None
    try:
        return Policy.model_validate(data)
    except ValidationError as err:
        raise PolicyError(_problems(source, err, data)) from None
