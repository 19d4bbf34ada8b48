"""Runs and tokens in SQLite: only token hashes stored, revocation, expiry, restarts and several workers."""

import hashlib
import re
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from egressd.reasons import Reason
from egressd.runs import Run, RunStore, rfc3339, token_digest

SHA = "ab" * 32


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "runs.sqlite"


@pytest.fixture
def store(db_path: Path) -> Iterator[RunStore]:
    runs = RunStore(db_path)
    yield runs
    runs.close()


def mint(store: RunStore, ttl: float = 3600, label: str = "") -> tuple[Run, str]:
    run, token, _ = store.mint("roastery-bot", 3, SHA, ttl, label)
    return run, token


def test_mint_returns_a_url_safe_token_of_at_least_128_bits(store: RunStore) -> None:
    run, token = mint(store, label="nightly")
    assert re.fullmatch(r"[A-Za-z0-9_-]+", token)
    assert len(token) * 6 >= 128  # each URL-safe base64 character carries 6 bits
    assert run.run_id.startswith("run_")
    assert (run.policy, run.version, run.policy_sha256, run.label) == ("roastery-bot", 3, SHA, "nightly")
    assert run.revoked_at is None
    assert run.expires_at == pytest.approx(run.created_at + 3600)
    assert run.created_at == pytest.approx(time.time(), abs=5)


def test_tokens_and_run_ids_are_unique(store: RunStore) -> None:
    minted = [mint(store) for _ in range(50)]
    assert len({token for _, token in minted}) == 50
    assert len({run.run_id for run, _ in minted}) == 50


def test_only_the_token_hash_is_stored(store: RunStore, db_path: Path) -> None:
    tokens = [mint(store)[1] for _ in range(5)]
    store.close()
    raw = b"".join(path.read_bytes() for path in db_path.parent.iterdir() if path.is_file())
    assert raw  # the store wrote something
    for token in tokens:
        assert token.encode() not in raw
        assert hashlib.sha256(token.encode()).hexdigest().encode() in raw


def test_token_digest_is_sha256() -> None:
    assert token_digest("abc") == hashlib.sha256(b"abc").hexdigest()


def test_database_file_is_private(store: RunStore, db_path: Path) -> None:
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o600


def test_by_token(store: RunStore) -> None:
    run, token = mint(store)
    other, other_token = mint(store)
    assert store.by_token(token) == run
    assert store.by_token(other_token) == other
    assert store.by_token("x" * 43) is None
    assert store.by_token("") is None
    assert store.by_token(token_digest(token)) is None  # the hash is not a credential
    assert store.get(run.run_id) == run
    assert store.get("run_missing") is None


def test_revoke(store: RunStore) -> None:
    run, token = mint(store)
    other, _ = mint(store)
    revoked = store.revoke(run.run_id)
    assert revoked is not None
    assert revoked.revoked_at is not None
    assert revoked.revoked_at == pytest.approx(time.time(), abs=5)
    assert store.by_token(token) == revoked
    assert revoked.refusal(time.time()) is Reason.TOKEN_REVOKED
    assert store.get(other.run_id) == other


def test_revoking_twice_keeps_the_first_time(store: RunStore) -> None:
    run, _ = mint(store)
    first = store.revoke(run.run_id)
    second = store.revoke(run.run_id)
    assert first is not None and second is not None
    assert second.revoked_at == first.revoked_at


def test_revoking_an_unknown_run(store: RunStore) -> None:
    assert store.revoke("run_unknown") is None


def test_expiry(store: RunStore) -> None:
    run, token = mint(store, ttl=60)
    found = store.by_token(token)
    assert found is not None
    assert found.refusal(run.created_at) is None
    assert found.refusal(run.expires_at - 0.001) is None
    assert found.refusal(run.expires_at) is Reason.TOKEN_EXPIRED
    assert found.refusal(run.expires_at + 3600) is Reason.TOKEN_EXPIRED


def test_revocation_wins_over_expiry(store: RunStore) -> None:
    run, _ = mint(store, ttl=1)
    revoked = store.revoke(run.run_id)
    assert revoked is not None
    assert revoked.refusal(run.expires_at + 10) is Reason.TOKEN_REVOKED


def test_summary_never_shows_the_token(store: RunStore) -> None:
    run, token = mint(store, ttl=10, label="lbl")
    summary = run.summary(run.created_at)
    assert token not in repr(summary)
    assert token_digest(token) not in repr(summary)
    assert summary["state"] == "active"
    assert summary["expires_at"] == rfc3339(run.expires_at)
    assert str(summary["expires_at"]).endswith("Z")
    assert run.summary(run.expires_at)["state"] == "expired"
    revoked = store.revoke(run.run_id)
    assert revoked is not None
    assert revoked.summary(run.created_at)["state"] == "revoked"


def test_rfc3339() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.25) == "2023-11-14T22:13:20.250Z"


def test_runs_survive_a_restart(db_path: Path) -> None:
    first = RunStore(db_path)
    live, live_token = mint(first)
    gone, gone_token = mint(first)
    first.revoke(gone.run_id)
    first.close()

    second = RunStore(db_path)
    try:
        assert second.by_token(live_token) == live
        restored = second.by_token(gone_token)
        assert restored is not None
        assert restored.refusal(time.time()) is Reason.TOKEN_REVOKED
        assert [run.run_id for run in second.all()] == [live.run_id, gone.run_id]
    finally:
        second.close()


def test_all_lists_runs_in_creation_order(store: RunStore) -> None:
    runs = [mint(store)[0] for _ in range(3)]
    assert store.all() == runs


def test_refused_among(store: RunStore) -> None:
    live, _ = mint(store, ttl=3600)
    expiring, _ = mint(store, ttl=10)
    revoked, _ = mint(store)
    store.revoke(revoked.run_id)
    now = expiring.expires_at + 1
    refused = store.refused_among([live.run_id, expiring.run_id, revoked.run_id, "run_deleted", live.run_id], now)
    assert refused == {
        expiring.run_id: Reason.TOKEN_EXPIRED,
        revoked.run_id: Reason.TOKEN_REVOKED,
        "run_deleted": Reason.TOKEN_REVOKED,
    }
    assert store.refused_among([], now) == {}
    assert store.refused_among(iter([live.run_id]), now) == {}


def test_refused_among_many_runs(store: RunStore) -> None:
    runs = [mint(store)[0] for _ in range(20)]
    for run in runs[::2]:
        store.revoke(run.run_id)
    refused = store.refused_among((run.run_id for run in runs), time.time())
    assert set(refused) == {run.run_id for run in runs[::2]}


def test_claim_expired_returns_each_run_once(store: RunStore) -> None:
    soon, _ = mint(store, ttl=10)
    later, _ = mint(store, ttl=100)
    revoked, _ = mint(store, ttl=10)
    store.revoke(revoked.run_id)
    assert store.claim_expired(soon.created_at) == []
    assert store.claim_expired(soon.expires_at + 1) == [soon]
    assert store.claim_expired(soon.expires_at + 2) == []
    assert store.claim_expired(later.expires_at + 1) == [later]
    assert store.claim_expired(later.expires_at + 1000) == []


def test_claim_expired_with_two_workers(db_path: Path) -> None:
    first, second = RunStore(db_path), RunStore(db_path)

    def race(horizon: float) -> list[str]:
        barrier = threading.Barrier(2)

        def reap(store: RunStore) -> list[Run]:
            barrier.wait()
            return [run for _ in range(3) for run in store.claim_expired(horizon)]

        with ThreadPoolExecutor(2) as pool:
            return [run.run_id for result in pool.map(reap, (first, second)) for run in result]

    try:
        for _ in range(6):  # several rounds: each is a fresh race between the two workers
            runs = [first.mint("p", 1, SHA, 1 + i % 5, "")[0] for i in range(60)]
            runs += [second.mint("p", 1, SHA, 1 + i % 5, "")[0] for i in range(60)]
            horizon = max(run.expires_at for run in runs) + 1
            claimed = race(horizon)
            assert len(claimed) == len(set(claimed)), "a run was claimed twice"
            assert sorted(claimed) == sorted(run.run_id for run in runs)
            assert first.claim_expired(horizon) == []
            assert second.claim_expired(horizon) == []
    finally:
        first.close()
        second.close()


def test_claims_survive_a_restart(db_path: Path) -> None:
    first = RunStore(db_path)
    run, _ = mint(first, ttl=1)
    assert first.claim_expired(run.expires_at + 1) == [run]
    first.close()
    second = RunStore(db_path)
    try:
        assert second.claim_expired(run.expires_at + 1) == []
    finally:
        second.close()


def test_a_revocation_is_seen_by_another_worker(db_path: Path) -> None:
    first, second = RunStore(db_path), RunStore(db_path)
    try:
        run, token = mint(first)
        assert second.refused_among([run.run_id], time.time()) == {}
        first.revoke(run.run_id)
        assert second.refused_among([run.run_id], time.time()) == {run.run_id: Reason.TOKEN_REVOKED}
        seen = second.by_token(token)
        assert seen is not None and seen.revoked_at is not None
    finally:
        first.close()
        second.close()


def test_placeholders_per_run_and_secret(store: RunStore) -> None:
    run, _, placeholders = store.mint("p", 1, SHA, 60, "", ["GITHUB_TOKEN", "API_KEY"])
    other, _, other_placeholders = store.mint("p", 1, SHA, 60, "", ["GITHUB_TOKEN"])
    assert set(placeholders) == {"GITHUB_TOKEN", "API_KEY"}
    for placeholder in (*placeholders.values(), *other_placeholders.values()):
        assert re.fullmatch(r"egressd_ph_[A-Za-z0-9]{32}", placeholder)
    assert placeholders["GITHUB_TOKEN"] != other_placeholders["GITHUB_TOKEN"]
    assert store.placeholders(run.run_id) == placeholders
    assert store.injected(run.run_id) == set()
    store.mark_injected(run.run_id, ["API_KEY"])
    assert store.injected(run.run_id) == {"API_KEY"}
    assert store.injected(other.run_id) == set()
