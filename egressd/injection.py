"""Placeholders and their substitution into requests; no I/O.

A run holds placeholders, never values. On an allowed request egressd finds placeholder-shaped strings in
header values (also inside `Authorization: Basic` credentials), the path and the query, and replaces each
with its value when it is this run's, the secret is bound to the tunnel's host, and the place is allowed.
The body is never touched."""

import base64
import binascii
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from egressd.policy import SecretBinding
from egressd.reasons import Decision, Reason, deny

PLACEHOLDER_PREFIX = "egressd_ph_"
PLACEHOLDER_SHAPE = re.compile(r"egressd_ph_[A-Za-z0-9_]+")
_ALPHABET = string.ascii_letters + string.digits
_RANDOM_CHARS = 32  # 32 base-62 characters: about 190 random bits


def new_placeholder() -> str:
    return PLACEHOLDER_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(_RANDOM_CHARS))


@dataclass(frozen=True)
class RunSecrets:
    """A run's secrets as the injector needs them: placeholder → name, name → value, name → binding."""

    names: Mapping[str, str]
    values: Mapping[str, str]
    bindings: Mapping[str, SecretBinding]


@dataclass
class Injected:
    headers: list[tuple[str, str]]
    path: str
    query: str
    names: set[str] = field(default_factory=set)


def inject(secrets_of_run: RunSecrets, host: str, headers: list[tuple[str, str]], path: str,
           query: str) -> Injected | Decision:
    """The request with this run's placeholders replaced by values, or the refusal if any placeholder may not
    go here (secret_not_allowed) or is not this run's (secret_unknown)."""
    result = Injected([], path, query)
    for name, value in headers:
        place = f"header:{name.lower()}"
        replaced = _basic_credentials(secrets_of_run, host, place, name, value, result.names)
        if replaced is None:
            replaced = _substitute(secrets_of_run, host, place, value, result.names, raw=True)
        if isinstance(replaced, Decision):
            return replaced
        result.headers.append((name, replaced))
    for place in ("path", "query"):
        replaced = _substitute(secrets_of_run, host, place, getattr(result, place), result.names, raw=False)
        if isinstance(replaced, Decision):
            return replaced
        setattr(result, place, replaced)
    return result


def _basic_credentials(secrets_of_run: RunSecrets, host: str, place: str, name: str, value: str,
                       names: set[str]) -> str | Decision | None:
    """`Authorization: Basic base64(user:pass)` with placeholders inside: decoded, substituted, re-encoded."""
    if name.lower() not in ("authorization", "proxy-authorization"):
        return None
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    if not PLACEHOLDER_SHAPE.search(decoded):
        return None
    replaced = _substitute(secrets_of_run, host, place, decoded, names, raw=True)
    if isinstance(replaced, Decision):
        return replaced
    return f"{scheme} {base64.b64encode(replaced.encode()).decode()}"


def _substitute(secrets_of_run: RunSecrets, host: str, place: str, text: str, names: set[str],
                raw: bool) -> str | Decision:
    refusal: Decision | None = None

    def replace(match: re.Match[str]) -> str:
        nonlocal refusal
        placeholder = match.group(0)
        secret = secrets_of_run.names.get(placeholder)
        binding = secrets_of_run.bindings.get(secret) if secret else None
        if secret is None or binding is None:
            refusal = refusal or deny(Reason.SECRET_UNKNOWN, f"a placeholder in the {_where(place)} is not this run's")
            return placeholder
        if host not in binding.hosts or not binding.allows_place(place):
            refusal = refusal or deny(Reason.SECRET_NOT_ALLOWED,
                                      f"secret {secret} may not be sent to {host} in the {_where(place)}")
            return placeholder
        names.add(secret)
        value = secrets_of_run.values[secret]
        return value if raw else quote(value, safe="")

    replaced = PLACEHOLDER_SHAPE.sub(replace, text)
    return refusal if refusal is not None else replaced


def _where(place: str) -> str:
    kind, _, header = place.partition(":")
    return f"{header} header" if kind == "header" else place
