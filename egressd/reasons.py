"""Reason codes for refusals: the contract other programs match on, with the HTTP status of each."""

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    AUTH_REQUIRED = "auth_required"
    TOKEN_INVALID = "token_invalid"
    TOKEN_EXPIRED = "token_expired"
    TOKEN_REVOKED = "token_revoked"
    HTTPS_ONLY = "https_only"
    IP_LITERAL = "ip_literal"
    INVALID_HOST = "invalid_host"
    PORT_NOT_ALLOWED = "port_not_allowed"
    HOST_NOT_ALLOWED = "host_not_allowed"
    DNS_FAILURE = "dns_failure"
    FORBIDDEN_ADDRESS = "forbidden_address"
    UPSTREAM_ERROR = "upstream_error"
    SNI_MISMATCH = "sni_mismatch"
    HOST_MISMATCH = "host_mismatch"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PATH_NOT_ALLOWED = "path_not_allowed"
    INVALID_PATH = "invalid_path"
    BAD_REQUEST = "bad_request"
    WEBSOCKET_NOT_ALLOWED = "websocket_not_allowed"
    POLICY_GONE = "policy_gone"
    SECRET_NOT_ALLOWED = "secret_not_allowed"
    SECRET_UNKNOWN = "secret_unknown"
    SCRUB_FAILED = "scrub_failed"

    @property
    def status(self) -> int:
        return _STATUS.get(self, 403)


_STATUS = {
    Reason.AUTH_REQUIRED: 407,
    Reason.TOKEN_INVALID: 407,
    Reason.TOKEN_EXPIRED: 407,
    Reason.TOKEN_REVOKED: 407,
    Reason.DNS_FAILURE: 502,
    Reason.UPSTREAM_ERROR: 502,
    Reason.SCRUB_FAILED: 502,
    Reason.BAD_REQUEST: 400,
}


@dataclass(frozen=True, slots=True)
class Decision:
    """The gate's answer: allowed when reason is None; detail is one sentence for a person."""

    reason: Reason | None
    detail: str = ""

    @property
    def allowed(self) -> bool:
        return self.reason is None


ALLOW = Decision(None)


def deny(reason: Reason, detail: str) -> Decision:
    return Decision(reason, detail)
