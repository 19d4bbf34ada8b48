"""An asyncio event loop running in a daemon thread, for test servers driven from synchronous tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["LoopThread"]

_START_TIMEOUT = 5.0


class LoopThread:
    """An asyncio loop in a daemon thread; exceptions the loop would log are kept in :attr:`errors`, not printed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> asyncio.AbstractEventLoop:
        """Start a fresh loop in a new thread named :attr:`name`; wait (with a timeout) until it runs."""
        loop = asyncio.new_event_loop()

        def on_error(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            self.errors.append(f"{context.get('message', '')}: {exc!r}" if exc else str(context.get("message")))

        loop.set_exception_handler(on_error)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.close()

        self.loop = loop
        self.thread = threading.Thread(target=run, name=self.name, daemon=True)
        self.thread.start()
        if not ready.wait(_START_TIMEOUT):
            raise RuntimeError(f"{self.name}: event loop did not start")
        return loop

    def run[T](self, coro: Awaitable[T], timeout: float = _START_TIMEOUT) -> T:
        """Run ``coro`` on the loop and return its result (``TimeoutError`` after ``timeout`` seconds)."""
        assert self.loop is not None

        async def wrapper() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(timeout)

    def stop(self, shutdown: Callable[[], Awaitable[None]]) -> None:
        """Run ``shutdown()`` on the loop (its errors ignored), then stop the loop and join the thread."""
        loop, thread = self.loop, self.thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            self.run(shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_START_TIMEOUT)
        self.loop = None
        self.thread = None
