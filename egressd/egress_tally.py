"""Each live run's egress in numbers (requests allowed and refused, refusals by host and reason), for the
launcher's summary. Bounded: a run keeps at most MAX_GROUPS refusal groups; the rest are counted as one."""

from collections import Counter
from dataclasses import dataclass, field

from egressd.audit import Subject

MAX_GROUPS = 200
OTHER = "(other)"


@dataclass
class _RunEgress:
    allowed: int = 0
    refused: int = 0
    refusals: Counter[tuple[str, str]] = field(default_factory=Counter)


class EgressTally:
    def __init__(self) -> None:
        self._runs: dict[str, _RunEgress] = {}

    def observe(self, event: str, decision: str, reason: str | None, subject: Subject) -> None:
        if event == "run" or subject.run_id is None:
            return
        if event == "connect" and decision == "allow":
            return  # a tunnel is not a request; its requests are counted one by one
        tally = self._runs.setdefault(subject.run_id, _RunEgress())
        if decision == "allow":
            tally.allowed += 1
            return
        tally.refused += 1
        key = (subject.host or "", reason or "")
        if key not in tally.refusals and len(tally.refusals) >= MAX_GROUPS:
            key = (OTHER, OTHER)
        tally.refusals[key] += 1

    def summary(self, run_id: str) -> dict[str, object]:
        tally = self._runs.get(run_id, _RunEgress())
        return {
            "allowed": tally.allowed,
            "refused": tally.refused,
            "refusals": [{"host": host, "reason": reason, "count": count}
                         for (host, reason), count in tally.refusals.most_common()],
        }

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
