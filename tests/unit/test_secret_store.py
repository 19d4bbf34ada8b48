"""Where secret values come from and where they are kept."""

import logging
from pathlib import Path

import pytest

from egressd.config import parse_config
from egressd.secret_store import SecretError, SecretStore, check_value

VALUE = "s3cr3t-value-for-tests"


def store(tmp_path: Path, config_text: str = "") -> SecretStore:
    config = parse_config(config_text, "test.toml", tmp_path)
    return SecretStore(config, tmp_path / "state")


def test_operator_secret_from_a_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "token").write_text(VALUE + "\n")
    (tmp_path / "token").chmod(0o644)
    secrets = store(tmp_path, '[secrets.TOKEN]\nfile = "token"\n')
    with caplog.at_level(logging.WARNING):
        secrets.load_operator()
    assert secrets.operator == {"TOKEN": VALUE}
    assert "readable by others" in caplog.text and VALUE not in caplog.text


def test_operator_secret_from_a_systemd_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    credentials = tmp_path / "creds"
    credentials.mkdir()
    (credentials / "gh").write_text(VALUE)
    (credentials / "gh").chmod(0o600)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    secrets = store(tmp_path, '[secrets.GH]\ncredential = "gh"\n')
    secrets.load_operator()
    assert secrets.operator == {"GH": VALUE}


def test_unreadable_or_bad_values_are_refused_without_showing_them(tmp_path: Path) -> None:
    (tmp_path / "short").write_text("abc")
    (tmp_path / "newline").write_text("line-one-xxxxx\nline-two-xxxxx\n")
    secrets = store(tmp_path, '[secrets.A]\nfile = "missing"\n[secrets.B]\nfile = "short"\n'
                              '[secrets.C]\nfile = "newline"\n')
    with pytest.raises(SecretError) as refused:
        secrets.load_operator()
    message = str(refused.value)
    assert "secret A" in message and "secret B" in message and "secret C" in message
    assert "abc" not in message and "line-one" not in message


def test_per_run_values_are_private_files_and_survive_a_restart(tmp_path: Path) -> None:
    secrets = store(tmp_path)
    secrets.put_run("run_0123456789abcdef", {"RUN": VALUE})
    directory = tmp_path / "state" / "secrets"
    assert directory.stat().st_mode & 0o777 == 0o700
    assert (directory / "run_0123456789abcdef.json").stat().st_mode & 0o777 == 0o600
    again = store(tmp_path)
    assert again.run_values("run_0123456789abcdef") == {"RUN": VALUE}
    again.drop_run("run_0123456789abcdef")
    assert list(directory.iterdir()) == []


def test_run_values_win_over_operator_values(tmp_path: Path) -> None:
    secrets = store(tmp_path)
    secrets.operator = {"TOKEN": "operator-value-1", "OTHER": "operator-value-2"}
    secrets.put_run("run_0123456789abcdef", {"TOKEN": VALUE})
    assert secrets.values_for("run_0123456789abcdef", ["TOKEN", "OTHER", "NONE"]) == {
        "TOKEN": VALUE, "OTHER": "operator-value-2"}


def test_run_ids_are_not_paths(tmp_path: Path) -> None:
    with pytest.raises(SecretError):
        store(tmp_path).put_run("../../etc/x", {"A": VALUE})


@pytest.mark.parametrize("value", ["short", "has\nnewline-inside", "tab\tinside-value", "x" * 70_000])
def test_check_value(value: str) -> None:
    with pytest.raises(SecretError):
        check_value("NAME", value)
