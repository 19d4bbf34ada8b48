"""Reading the run's token out of a Proxy-Authorization header value; no I/O."""

import base64
import re

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{16,128}$")


def token_from_header(value: str | None) -> str | None:
    """`Basic base64(any-user:TOKEN)` or `Bearer TOKEN` → TOKEN; None when absent or malformed."""
    if not value:
        return None
    scheme, _, param = value.strip().partition(" ")
    param = param.strip()
    scheme = scheme.lower()
    if scheme == "bearer":
        token = param
    elif scheme == "basic":
        try:
            decoded = base64.b64decode(param, validate=True).decode("utf-8")
        except ValueError:  # binascii.Error, UnicodeDecodeError, or non-ASCII text in the header
            return None
        _, sep, token = decoded.partition(":")
        if not sep:
            return None
    else:
        return None
    return token if _TOKEN.fullmatch(token) else None
