"""Writing files that hold keys or secrets."""

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Writes atomically, created with its final mode so the content is never readable by others, even briefly."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
