"""What does scrubbing replies cost? Downloads through egressd on a run whose replies are scrubbed (a
secret was injected) against a run without secrets, measured in the same run, alternating.

    .venv/bin/python bench/scrub.py [--size-mib 32] [--rounds 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

from _harness import Egressd, isolate, loopback_world

POLICY = """
name = "bench"
version = 1
[[allow]]
host = "api.example.test"
reason = "load target"
[[secret]]
name = "TOKEN"
hosts = ["api.example.test"]
"""


def download(daemon: Egressd, run: dict, url: str, header: str) -> float:
    """Seconds for one download (body discarded), checked for a 200."""
    started = time.perf_counter()
    done = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "120",
                           "-x", run["proxy_url"], "--cacert", str(daemon.ca_cert), "-H", header, url],
                          capture_output=True, text=True, timeout=150)
    if done.stdout != "200":
        raise RuntimeError(f"download failed: {done.stdout} {done.stderr}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    isolate()
    with loopback_world() as (root, dns, ca_pem):
        secret = root / "token"
        secret.write_text("bench-secret-value-0123456789\n")
        daemon = Egressd(root / "egressd", dns.server_spec, ca_pem)
        daemon.write_policy("bench.toml", POLICY)
        daemon.start()
        try:
            plain = daemon.mint("bench", "--secret", f"TOKEN=@{secret}")
            scrubbed = daemon.mint("bench", "--secret", f"TOKEN=@{secret}")
            # One injection makes every later reply on that run scrubbed; the other run never injects.
            download(daemon, scrubbed, "https://api.example.test/x",
                     f"Authorization: Bearer {scrubbed['placeholders']['TOKEN']}")
            url = f"https://api.example.test/bytes/{args.size_mib * 1024 * 1024}"
            times: dict[str, list[float]] = {"plain": [], "scrubbed": []}
            for _ in range(args.rounds):
                times["plain"].append(download(daemon, plain, url, "X-Bench: 1"))
                times["scrubbed"].append(download(daemon, scrubbed, url, "X-Bench: 1"))
        finally:
            daemon.stop()
    rates = {name: args.size_mib / statistics.median(seconds) for name, seconds in times.items()}
    print(f"plain    {rates['plain']:8.1f} MiB/s")
    print(f"scrubbed {rates['scrubbed']:8.1f} MiB/s   scrubbed/plain = {rates['scrubbed'] / rates['plain']:.2f}")
    print(json.dumps({**rates, "ratio": round(rates["scrubbed"] / rates["plain"], 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
