"""The open tunnels: which run, policy version, host and checked address each client connection carries."""

import asyncio
from dataclasses import dataclass, field

from egressd.audit import Subject
from egressd.decision import Target
from egressd.injection import RunSecrets
from egressd.runs import Run
from egressd.scrub import Scrubber


@dataclass(slots=True)
class Tunnel:
    run: Run
    target: Target
    addr: str  # the one address the gate checked; every upstream connection of this tunnel goes here
    subject: Subject
    secrets: RunSecrets
    upstream_tls_error: str | None = None
    connect_timed_out: bool = False
    scrubber: tuple[frozenset[str], Scrubber] | None = None  # built for these injected secrets' names
    connect_timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Tunnels:
    def __init__(self) -> None:
        self._by_client: dict[str, Tunnel] = {}

    def open(self, client_id: str, tunnel: Tunnel) -> None:
        self._by_client[client_id] = tunnel

    def get(self, client_id: str) -> Tunnel | None:
        return self._by_client.get(client_id)

    def close(self, client_id: str) -> Tunnel | None:
        tunnel = self._by_client.pop(client_id, None)
        if tunnel is not None and tunnel.connect_timer is not None:
            tunnel.connect_timer.cancel()
        return tunnel

    def run_ids(self) -> set[str]:
        return {tunnel.run.run_id for tunnel in self._by_client.values()}

    def __len__(self) -> int:
        return len(self._by_client)

    def clients_of(self, run_ids: set[str]) -> list[str]:
        return [client for client, tunnel in self._by_client.items() if tunnel.run.run_id in run_ids]
