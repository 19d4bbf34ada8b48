"""The outside end of a sandbox's proxy socket: a Unix socket whose every connection is relayed to egressd's
proxy listener, and nowhere else. Runs on its own event loop in a thread of the launcher."""

import asyncio
import contextlib
import threading
from pathlib import Path

BUFFER = 65536
CONNECT_TIMEOUT = 10.0


class ProxyRelay:
    def __init__(self, path: Path, proxy: tuple[str, int]) -> None:
        self.path = path
        self.proxy = proxy
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="egressd-relay", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        future.result(CONNECT_TIMEOUT)
        self.path.chmod(0o666)  # the sandbox runs as another user; the socket leads only to the proxy

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(CONNECT_TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONNECT_TIMEOUT)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _listen(self) -> None:
        self._server = await asyncio.start_unix_server(self._relay, path=str(self.path))

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            proxy_reader, proxy_writer = await asyncio.wait_for(asyncio.open_connection(*self.proxy),
                                                                CONNECT_TIMEOUT)
        except (OSError, TimeoutError):
            client_writer.close()
            return
        try:
            await asyncio.gather(_pump(client_reader, proxy_writer), _pump(proxy_reader, client_writer))
        finally:
            client_writer.close()
            proxy_writer.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction, until its end; the other direction goes on (a half-closed connection is normal)."""
    try:
        while data := await reader.read(BUFFER):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass
