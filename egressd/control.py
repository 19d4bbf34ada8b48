"""The control socket: a Unix socket (mode 0600) where the CLI asks the daemon to mint, revoke and list runs,
reload policies and explain decisions. One JSON request line per connection, one JSON reply line."""

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from egressd.service import RequestError, Service

log = logging.getLogger(__name__)

MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT = 10.0


class ControlError(RuntimeError):
    """The daemon refused a request, or could not be reached; the message says which and why."""


def _text(request: dict[str, object], key: str) -> str:
    value = request.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(f"'{key}' must be a non-empty string")
    return value


def _optional_int(request: dict[str, object], key: str) -> int | None:
    value = request.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise RequestError(f"'{key}' must be an integer")
    return value


def _optional_number(request: dict[str, object], key: str) -> float | None:
    value = request.get(key)
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
        raise RequestError(f"'{key}' must be a number")
    return value


class ControlServer:
    def __init__(self, service: Service, path: Path, mode: int = 0o600) -> None:
        self.service = service
        self.path = path
        self.mode = mode
        self._server: asyncio.Server | None = None
        self._ops: dict[str, Callable[[dict[str, object]], Awaitable[object]]] = {
            "mint": self._mint,
            "revoke": self._revoke,
            "list": self._list,
            "reload": self._reload,
            "explain": self._explain,
            "egress": self._egress,
        }

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old_umask = os.umask(0o177)  # the socket is created 0600: never a moment when others can connect
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        finally:
            os.umask(old_umask)
        self.path.chmod(self.mode)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT)
            reply = await self._answer(line)
            writer.write(json.dumps(reply).encode() + b"\n")
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT)
        except (TimeoutError, ConnectionError, ValueError) as err:
            log.warning("control: dropped a request: %s", err)
        finally:
            writer.close()

    async def _answer(self, line: bytes) -> dict[str, object]:
        if len(line) > MAX_REQUEST or not line.endswith(b"\n"):
            return {"ok": False, "error": "request too large or not one JSON line"}
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "request is not JSON"}
        if not isinstance(request, dict) or request.get("op") not in self._ops:
            return {"ok": False, "error": f"unknown op; one of {sorted(self._ops)}"}
        try:
            return {"ok": True, "result": await self._ops[request["op"]](request)}
        except RequestError as err:
            return {"ok": False, "error": str(err)}
        except Exception:
            log.exception("control: %s failed", request["op"])
            return {"ok": False, "error": "internal error; see the daemon's log"}

    async def _mint(self, request: dict[str, object]) -> object:
        label = request.get("label", "")
        if not isinstance(label, str):
            raise RequestError("'label' must be a string")
        secrets = request.get("secrets") or {}
        if not isinstance(secrets, dict) or not all(isinstance(v, str) for v in secrets.values()):
            raise RequestError("'secrets' must map names to string values")
        return self.service.mint(
            _text(request, "policy"), _optional_int(request, "version"), _optional_number(request, "ttl"), label,
            secrets,
        )

    async def _revoke(self, request: dict[str, object]) -> object:
        return self.service.revoke(_text(request, "run_id"))

    async def _egress(self, request: dict[str, object]) -> object:
        return self.service.run_egress(_text(request, "run_id"))

    async def _list(self, request: dict[str, object]) -> object:
        return self.service.list_runs()

    async def _reload(self, request: dict[str, object]) -> object:
        return self.service.reload()

    async def _explain(self, request: dict[str, object]) -> object:
        return await self.service.explain(
            _text(request, "policy"), _optional_int(request, "version"), _text(request, "method"),
            _text(request, "url"),
        )


def call(path: Path, request: dict[str, object], timeout: float = 30.0) -> object:
    """Sends one request to the daemon and returns its result, or raises ControlError."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except FileNotFoundError:
        raise ControlError(f"{path}: no control socket; is `egressd serve` running with this config?") from None
    except PermissionError:
        raise ControlError(f"{path}: permission denied; run as the daemon's user or group") from None
    except OSError as err:
        raise ControlError(f"{path}: cannot talk to the daemon: {err.strerror or err}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise ControlError("the daemon sent no valid reply") from None
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "request failed")))
    return reply["result"]
