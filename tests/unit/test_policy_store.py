"""Loading the policies directory: all or nothing, immutable versions recorded in the state dir, restarts."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from egressd.policy import Policy, parse_policy
from egressd.policy_store import PolicyLock, PolicySet, PolicyStore, read_policy_files


def policy_text(name: str, version: int, host: str = "api.example.com", methods: str = '["GET"]') -> str:
    return (
        f'name = "{name}"\nversion = {version}\n\n'
        f'[[allow]]\nhost = "{host}"\nreason = "Needed for the job"\nmethods = {methods}\n'
    )


class Env:
    """A policies directory and a state dir, with helpers to write files and (re)start the store."""

    def __init__(self, root: Path) -> None:
        self.policies = root / "policies"
        self.policies.mkdir()
        self.lock_path = root / "var" / "egressd.sqlite"
        self.locks: list[PolicyLock] = []

    def write(self, file: str, text: str) -> Path:
        path = self.policies / file
        path.write_text(text, encoding="utf-8")
        return path

    def store(self) -> PolicyStore:
        """A fresh store on the same state: what a restart (or another worker) sees."""
        lock = PolicyLock(self.lock_path)
        self.locks.append(lock)
        return PolicyStore(self.policies, lock)

    def close(self) -> None:
        for lock in self.locks:
            lock._db.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    environment = Env(tmp_path)
    yield environment
    environment.close()


def loaded(store: PolicyStore) -> dict[tuple[str, int], str]:
    return {key: policy.sha256 for key, policy in store.current.versions.items()}


def test_first_load(env: Env) -> None:
    env.write("bot-v1.toml", policy_text("bot", 1))
    env.write("bot-v2.toml", policy_text("bot", 2, methods='["GET", "POST"]'))
    env.write("reader-v1.toml", policy_text("reader", 1, host="docs.example.org"))
    env.write("notes.txt", "not a policy")
    store = env.store()
    assert store.reload() == []
    assert set(store.current.versions) == {("bot", 1), ("bot", 2), ("reader", 1)}
    assert len(store.current) == 3


def test_empty_directory_loads_nothing(env: Env) -> None:
    store = env.store()
    assert store.reload() == []
    assert len(store.current) == 0


def test_missing_directory_is_a_problem(tmp_path: Path, env: Env) -> None:
    store = PolicyStore(tmp_path / "nowhere", PolicyLock(env.lock_path))
    env.locks.append(store._lock)
    problems = store.reload()
    assert problems == [] or all("nowhere" in problem for problem in problems)
    assert len(store.current) == 0


def test_reload_is_all_or_nothing(env: Env) -> None:
    env.write("bot-v1.toml", policy_text("bot", 1))
    store = env.store()
    assert store.reload() == []
    before = store.current

    env.write("bot-v2.toml", policy_text("bot", 2))  # fine on its own
    bad = env.write("broken-v1.toml", policy_text("broken", 1, host="10.0.0.1"))
    problems = store.reload()
    assert len(problems) == 1
    assert problems[0].startswith(f"{bad}: allow[0].host: ")
    assert store.current is before
    assert set(store.current.versions) == {("bot", 1)}

    bad.unlink()
    assert store.reload() == []
    assert set(store.current.versions) == {("bot", 1), ("bot", 2)}


def test_every_bad_file_is_listed(env: Env) -> None:
    env.write("good-v1.toml", policy_text("good", 1))
    first = env.write("a-v1.toml", "name = [")
    second = env.write("b-v1.toml", policy_text("b", 0))
    store = env.store()
    problems = store.reload()
    assert len(problems) == 2
    assert problems[0].startswith(f"{first}: not valid TOML")
    assert problems[1].startswith(f"{second}: version: ")
    assert len(store.current) == 0


def test_unreadable_file_is_a_problem(env: Env) -> None:
    (env.policies / "bin-v1.toml").write_bytes(b"name = \"\xff\xfe\"\n")
    problems = env.store().reload()
    assert len(problems) == 1
    assert "bin-v1.toml" in problems[0]


def test_duplicate_name_and_version_is_refused(env: Env) -> None:
    first = env.write("bot-a.toml", policy_text("bot", 1))
    second = env.write("bot-b.toml", policy_text("bot", 1, host="other.example.com"))
    store = env.store()
    problems = store.reload()
    assert problems == [f"{second}: bot@1 is also defined in {first}"]
    assert len(store.current) == 0


def test_identical_duplicate_is_refused_too(env: Env) -> None:
    env.write("bot-a.toml", policy_text("bot", 1))
    env.write("bot-b.toml", "# a copy\n" + policy_text("bot", 1))
    assert len(env.store().reload()) == 1


def test_removing_a_file_removes_that_version(env: Env) -> None:
    env.write("bot-v1.toml", policy_text("bot", 1))
    v2 = env.write("bot-v2.toml", policy_text("bot", 2, methods='["POST"]'))
    store = env.store()
    assert store.reload() == []
    assert store.current.get("bot") is not None
    v2.unlink()
    assert store.reload() == []
    assert set(store.current.versions) == {("bot", 1)}
    assert store.current.get("bot", 2) is None
    highest = store.current.get("bot")
    assert highest is not None and highest.version == 1


def test_reformatting_a_version_is_not_a_change(env: Env) -> None:
    path = env.write("bot-v1.toml", policy_text("bot", 1))
    store = env.store()
    assert store.reload() == []
    sha = loaded(store)[("bot", 1)]
    path.write_text("# Same policy, new comments and order.\n" + policy_text("bot", 1).replace('"GET"', '"get"'))
    assert store.reload() == []
    assert loaded(store)[("bot", 1)] == sha


def test_changed_content_under_the_same_version_is_refused(env: Env) -> None:
    path = env.write("bot-v1.toml", policy_text("bot", 1))
    env.write("other-v1.toml", policy_text("other", 1))
    store = env.store()
    assert store.reload() == []
    original = store.current.get("bot", 1)
    assert original is not None

    path.write_text(policy_text("bot", 1, methods='["GET", "POST", "DELETE"]'))
    env.write("new-v1.toml", policy_text("new", 1))
    problems = store.reload()
    assert len(problems) == 1
    assert "bot@1 changed since it was first loaded" in problems[0]
    assert "new version" in problems[0]
    # Nothing changes: the recorded content keeps serving and the new file waits for a clean reload.
    served = store.current.get("bot", 1)
    assert served is not None
    assert served.sha256 == original.sha256
    assert served.allow[0].methods == ("GET",)
    assert store.current.get("new") is None


def test_changed_content_keeps_its_recorded_content_across_a_restart(env: Env) -> None:
    path = env.write("bot-v1.toml", policy_text("bot", 1))
    env.write("other-v1.toml", policy_text("other", 1))
    first = env.store()
    assert first.reload() == []
    original = first.current.get("bot", 1)
    assert original is not None

    path.write_text(policy_text("bot", 1, host="evil.example.net"))
    restarted = env.store()
    problems = restarted.reload()
    assert len(problems) == 1
    assert "bot@1 changed since it was first loaded" in problems[0]
    served = restarted.current.get("bot", 1)
    assert served == original
    assert served is not None and served.sha256 == original.sha256
    assert served.rules_for("evil.example.net") == ()
    # The rest still loads on the first load after the restart.
    assert restarted.current.get("other", 1) is not None


def test_a_removed_version_cannot_come_back_different(env: Env) -> None:
    path = env.write("bot-v1.toml", policy_text("bot", 1))
    store = env.store()
    assert store.reload() == []
    original = loaded(store)[("bot", 1)]
    path.unlink()
    assert store.reload() == []
    assert len(store.current) == 0
    env.write("bot-v1.toml", policy_text("bot", 1, methods='["POST"]'))
    problems = store.reload()
    assert len(problems) == 1 and "changed since it was first loaded" in problems[0]
    assert loaded(store) == {("bot", 1): original}  # the recorded content, not the file


def test_a_new_version_is_the_way_to_widen_access(env: Env) -> None:
    env.write("bot-v1.toml", policy_text("bot", 1))
    store = env.store()
    assert store.reload() == []
    env.write("bot-v2.toml", policy_text("bot", 2, methods='["GET", "POST"]'))
    assert store.reload() == []
    newest = store.current.get("bot")
    assert newest is not None and newest.version == 2
    oldest = store.current.get("bot", 1)
    assert oldest is not None and oldest.allow[0].methods == ("GET",)


def test_lock_records_canonical_content(env: Env) -> None:
    lock = PolicyLock(env.lock_path)
    env.locks.append(lock)
    policy = parse_policy(
        policy_text("idn", 1, host="bücher.example")
        + '\n[open_web]\nreason = "Read"\nmethods = ["head", "GET"]\n',
        "idn.toml",
    )
    assert lock.recorded(policy) is None
    lock.record(policy)
    recorded = lock.recorded(policy)
    assert recorded == policy
    assert recorded is not None and recorded.sha256 == policy.sha256
    # The first record wins: recording other content under the same key changes nothing.
    other = parse_policy(policy_text("idn", 1, host="other.example"), "idn2.toml")
    lock.record(other)
    assert lock.recorded(other) == policy


def test_read_policy_files_reports_per_file(env: Env) -> None:
    env.write("a-v1.toml", policy_text("a", 1))
    bad = env.write("b-v1.toml", policy_text("b", 1) + "surprise = true\n")
    policies, problems = read_policy_files(env.policies)
    assert [policy.key for policy in policies] == [("a", 1)]
    assert problems == [f"{bad}: allow[0].surprise (host 'api.example.com'): unknown key"]


# --- PolicySet -----------------------------------------------------------------------------------------------


def _policy(name: str, version: int) -> Policy:
    return parse_policy(policy_text(name, version), f"{name}-v{version}.toml")


def test_policy_set_get_defaults_to_the_highest_version() -> None:
    versions = [_policy("bot", 2), _policy("bot", 10), _policy("bot", 3), _policy("other", 99)]
    policies = PolicySet({policy.key: policy for policy in versions})
    highest = policies.get("bot")
    assert highest is not None and highest.version == 10  # numeric, not lexical
    explicit = policies.get("bot", 3)
    assert explicit is not None and explicit.version == 3
    assert policies.get("bot", 4) is None
    assert policies.get("missing") is None
    assert policies.get("missing", 1) is None
    assert len(policies) == 4
    assert len(PolicySet()) == 0
    assert PolicySet().get("bot") is None
