"""Does uvloop make egressd faster? egressd on asyncio's loop vs on uvloop, measured in the same run.

Runs inside a network namespace of its own (re-executes itself under `unshare --net` when run as root
outside one), with the tests' scripted DNS server and HTTPS upstream on loopback, and `hey` (Debian package)
as the load. Rounds alternate between the two loops; the report is the median requests/s of each and the
ratio uvloop / asyncio (> 1 means uvloop is faster). Bounded: a fixed request count per round, timeouts.

    .venv/bin/python bench/loops.py [--requests 2000] [--rounds 3]
"""

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys

from _harness import Egressd, isolate, loopback_world

POLICY = 'name = "bench"\nversion = 1\n[[allow]]\nhost = "api.example.test"\nreason = "load target"\n'
# Starts egressd with uvloop as the event loop; everything else exactly as `egressd serve`.
UVLOOP_ENTRY = "import sys, uvloop; uvloop.install(); from egressd.cli import main; sys.exit(main(sys.argv[1:]))"


def hey(proxy_url: str, requests: int, concurrency: int, keepalive: bool) -> float:
    command = ["hey", "-n", str(requests), "-c", str(concurrency), "-t", "10", "-x", proxy_url]
    if not keepalive:
        command.append("-disable-keepalive")
    done = subprocess.run([*command, "https://api.example.test/"], capture_output=True, text=True, timeout=300)
    match = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if not match or "[200]" not in done.stdout:
        raise RuntimeError(f"hey failed:\n{done.stdout}\n{done.stderr}")
    return float(match.group(1))


class LoopDaemon(Egressd):
    def __init__(self, *args: object, uvloop: bool, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.uvloop = uvloop

    def command(self) -> list[str]:
        if self.uvloop:
            return [sys.executable, "-c", UVLOOP_ENTRY, "serve", "--config", str(self.config)]
        return super().command()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    isolate()
    if shutil.which("hey") is None:
        sys.exit("bench/loops.py: needs hey (apt-get install hey)")

    with loopback_world() as (root, dns, ca_pem):
        daemons = {}
        for index, (name, uv) in enumerate((("asyncio", False), ("uvloop", True))):
            daemon = LoopDaemon(root / name, dns.server_spec, ca_pem, listen=f"127.0.0.1:{3128 + index}",
                                metrics=f"127.0.0.1:{9464 + index}", uvloop=uv)
            daemon.write_policy("bench.toml", POLICY)
            try:
                daemons[name] = daemon.start()
            except RuntimeError as err:
                # mitmproxy 12 on Python 3.13 installs an eager task factory that uvloop's loop rejects.
                last = str(err).strip().splitlines()[-3:]
                print(f"egressd on {name} does not start on Python {sys.version.split()[0]}:", *last, sep="\n  ")
                for started in daemons.values():
                    started.stop()
                return 1
        try:
            urls = {name: daemon.mint("bench")["proxy_url"] for name, daemon in daemons.items()}
            results: dict[str, dict[str, list[float]]] = {}
            for label, concurrency, keepalive in (("keep-alive c=1", 1, True), ("keep-alive c=10", 10, True),
                                                  ("keep-alive c=50", 50, True), ("new tunnels c=10", 10, False)):
                results[label] = {name: [] for name in daemons}
                for _ in range(args.rounds):
                    for name in daemons:  # alternate, so drift on a noisy machine hits both alike
                        results[label][name].append(hey(urls[name], args.requests, concurrency, keepalive))
        finally:
            for daemon in daemons.values():
                daemon.stop()
    report = {}
    print(f"{'load':<18} {'asyncio req/s':>14} {'uvloop req/s':>13} {'uvloop/asyncio':>15}")
    for label, by_loop in results.items():
        base, uv = statistics.median(by_loop["asyncio"]), statistics.median(by_loop["uvloop"])
        report[label] = {"asyncio": base, "uvloop": uv, "ratio": round(uv / base, 3)}
        print(f"{label:<18} {base:>14.0f} {uv:>13.0f} {uv / base:>15.2f}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
