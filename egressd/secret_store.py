"""Secret values, kept by the daemon only: operator secrets read from files (or systemd credentials), and
per-run values given at mint, kept in memory and under <state>/secrets/ (0700, files 0600) so runs survive a
restart. No value ever goes into a log line, an error message, a reply or any other file."""

import contextlib
import json
import logging
import os
import re
import stat
from pathlib import Path

from egressd.config import Config
from egressd.files import write_atomic

log = logging.getLogger(__name__)

MIN_LENGTH = 8  # shorter values would make reply scrubbing rewrite ordinary text
MAX_LENGTH = 64 * 1024
_RUN_ID = re.compile(r"^run_[0-9a-f]{16}$")


class SecretError(ValueError):
    """A secret that cannot be used; the message names it and says why, never showing the value."""


def check_value(name: str, value: str) -> str:
    if len(value) < MIN_LENGTH:
        raise SecretError(f"secret {name}: the value is shorter than {MIN_LENGTH} characters")
    if len(value) > MAX_LENGTH:
        raise SecretError(f"secret {name}: the value is longer than {MAX_LENGTH} characters")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        raise SecretError(f"secret {name}: the value holds control characters (a newline inside?)")
    return value


def read_value(name: str, path: Path) -> str:
    """A value from a file: UTF-8, one trailing newline dropped."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SecretError(f"secret {name}: cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    if mode & 0o077:
        log.warning("secret %s: %s is readable by others (mode %04o); chmod 600 it", name, path, mode)
    return check_value(name, text.removesuffix("\n").removesuffix("\r"))


class SecretStore:
    def __init__(self, config: Config, state_dir: Path) -> None:
        self._config = config
        self._dir = state_dir / "secrets"
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._dir.chmod(0o700)
        self.operator: dict[str, str] = {}
        self._runs: dict[str, dict[str, str]] = {}

    def load_operator(self) -> None:
        """Reads every operator secret named in the config; raises SecretError naming each that fails."""
        values, problems = {}, []
        for name, source in self._config.secrets.items():
            try:
                values[name] = read_value(name, self._source_path(name, source.file, source.credential))
            except SecretError as err:
                problems.append(str(err))
        if problems:
            raise SecretError("\n".join(problems))
        self.operator = values

    def _source_path(self, name: str, file: str, credential: str) -> Path:
        if file:
            return self._config.path(file)
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            raise SecretError(f"secret {name}: credential {credential!r} needs $CREDENTIALS_DIRECTORY (systemd)")
        return Path(directory) / credential

    def put_run(self, run_id: str, values: dict[str, str]) -> None:
        if not values:
            return
        write_atomic(self._run_file(run_id), json.dumps(values).encode(), 0o600)
        self._runs[run_id] = dict(values)

    def run_values(self, run_id: str) -> dict[str, str]:
        if run_id not in self._runs:
            try:
                self._runs[run_id] = json.loads(self._run_file(run_id).read_bytes())
            except FileNotFoundError:
                self._runs[run_id] = {}
        return self._runs[run_id]

    def values_for(self, run_id: str, names: list[str]) -> dict[str, str]:
        """The values of a run's secrets: its own, else the operator's."""
        own = self.run_values(run_id)
        return {name: own.get(name) or self.operator[name] for name in names if name in own or name in self.operator}

    def drop_run(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        with contextlib.suppress(FileNotFoundError):
            self._run_file(run_id).unlink()

    def _run_file(self, run_id: str) -> Path:
        if not _RUN_ID.fullmatch(run_id):
            raise SecretError(f"not a run id: {run_id!r}")
        return self._dir / f"{run_id}.json"
