"""Ending a server process a test started: politely first, then for sure, every wait bounded."""

import signal
import subprocess


def stop_process(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
