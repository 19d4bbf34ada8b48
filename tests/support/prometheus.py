"""A real Prometheus (the Debian package's /usr/bin/prometheus) for the monitoring tests, on loopback only.

    with Prometheus(["127.0.0.1:9464"]) as prom:      # job "egressd", scrape and evaluation every second
        prom.wait_for('up{job="egressd"} == 1')
        prom.query("policy_decision:egressd_requests:rate5m")

Also: the PromQL expressions of the Grafana dashboard and of the rules file, and the metric names an
expression refers to. Standard library only, plus ruamel.yaml (a mitmproxy dependency) to read the rules.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from tests.support.processes import stop_process

REPO = Path(__file__).resolve().parents[2]
RULES_FILE = REPO / "packaging" / "prometheus" / "egressd-rules.yml"
RULES_TEST_FILE = REPO / "packaging" / "prometheus" / "egressd-rules.test.yml"
DASHBOARD_FILE = REPO / "packaging" / "grafana" / "egressd.json"
PROMETHEUS_BINARY = "/usr/bin/prometheus"
PROMTOOL_BINARY = "/usr/bin/promtool"
INSTALL_HINT = "apt-get install prometheus"
READY_TIMEOUT = 30.0

# Never through an http_proxy from the environment: every request goes straight to 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusError(RuntimeError):
    """The HTTP API answered with status "error" (a bad expression, a timeout...), or not at all."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise RuntimeError(f"{binary} not found: {INSTALL_HINT}")
    return path


class Prometheus:
    """One Prometheus process on 127.0.0.1:<free port>, its config, data and log in a directory of its own.

    Ready (/-/ready) within ~0.1 s, but Prometheus applies new scrape targets on a 5 s tick, so the first
    scrape lands up to ~5 s after start: wait_for('up{job="egressd"} == 1') before relying on data.
    """

    def __init__(self, targets: Sequence[str] = (), *, rule_files: Sequence[Path] = (RULES_FILE,),
                 job: str = "egressd", scrape_interval: str = "1s", evaluation_interval: str = "1s",
                 metrics_path: str = "/metrics", root: Path | None = None, binary: str = PROMETHEUS_BINARY,
                 port: int | None = None) -> None:
        for target in targets:
            host = target.rsplit(":", 1)[0]
            if not host.startswith("127."):
                raise ValueError(f"scrape target {target!r} is not on 127.0.0.0/8")
        self.targets = list(targets)
        self.rule_files = [Path(path).resolve() for path in rule_files]
        self.job = job
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.metrics_path = metrics_path
        self.binary = binary
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="egressd-prometheus-")
            root = Path(self._tmp.name)
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.config_file = self.root / "prometheus.yml"
        self.log_file = self.root / "prometheus.log"
        self.data_dir = self.root / "data"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def config(self) -> dict[str, Any]:
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [{
                "job_name": self.job,
                "metrics_path": self.metrics_path,
                "scheme": "http",
                "static_configs": [{"targets": self.targets}],
            }],
        }

    # --- lifecycle ----------------------------------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT) -> Prometheus:
        if self.process is not None:
            return self
        binary = _require(self.binary)
        # YAML is a superset of JSON: no YAML writer needed.
        self.config_file.write_text(json.dumps(self.config(), indent=2) + "\n")
        command = [
            binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address={self.address}",
            "--log.level=info",
        ]
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                message = f"prometheus exited at start ({self.process.returncode}):\n{self.log()}"
                self.stop()
                raise RuntimeError(message)
            with contextlib.suppress(OSError), _OPENER.open(f"{self.url}/-/ready", timeout=2) as answer:
                if answer.status == 200:
                    return self
            if time.monotonic() > deadline:
                message = f"prometheus was not ready within {timeout}s:\n{self.log()}"
                self.stop()
                raise RuntimeError(message)
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    # --- HTTP API -----------------------------------------------------------------------------------------

    def api(self, path: str, params: dict[str, str] | None = None, timeout: float = 10.0) -> Any:
        """GET /api/v1/<path>; returns `data`, raises PrometheusError unless status is "success"."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with _OPENER.open(url, timeout=timeout) as answer:
                body = answer.read()
        except urllib.error.HTTPError as error:  # 400/422/503 carry a JSON body naming the problem
            body = error.read()
            error.close()
        except OSError as error:
            raise PrometheusError(f"GET {url}: {error}") from error
        try:
            reply = json.loads(body)
        except ValueError as error:
            raise PrometheusError(f"GET {url}: not JSON: {body[:200]!r}") from error
        if reply.get("status") != "success":
            raise PrometheusError(f"GET {url}: {reply.get('errorType')}: {reply.get('error')}")
        return reply["data"]

    def query(self, expr: str, at: float | None = None) -> list:
        """An instant query; the `result` list (for a scalar or string result: [time, "value"])."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", params)["result"]

    def wait_for(self, expr: str, timeout: float = 30.0, interval: float = 0.25) -> list:
        """Queries until the result is non-empty and returns it; a query error is raised at once."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expr!r} returned nothing within {timeout}s")
            time.sleep(interval)

    def rules(self) -> dict:
        """GET /api/v1/rules: {"groups": [{"name", "file", "rules": [{"name", "query", "health", ...}]}]}."""
        return self.api("rules")

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]


# --- expressions --------------------------------------------------------------------------------------------

def load_rules(path: Path = RULES_FILE) -> dict:
    return YAML(typ="safe").load(Path(path).read_text())


def rules_exprs(path: Path = RULES_FILE) -> list[str]:
    """Every rule's `expr` in the rules file, in order (recording rules and alerts)."""
    return [str(rule["expr"]).strip() for group in load_rules(path)["groups"] for rule in group["rules"]]


def load_dashboard(path: Path = DASHBOARD_FILE) -> dict:
    return json.loads(Path(path).read_text())


def iter_panels(panels: Iterable[dict]) -> Iterable[dict]:
    """Panels, including those nested in collapsed rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", ()))


def dashboard_exprs(path: Path = DASHBOARD_FILE) -> list[str]:
    """Every panel target's `expr`, as written (with Grafana variables such as $policy; see render_grafana)."""
    return [target["expr"] for panel in iter_panels(load_dashboard(path)["panels"])
            for target in panel.get("targets", ()) if target.get("expr")]


GRAFANA_DEFAULTS = {
    "policy": ".*",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
}


def render_grafana(expr: str, **variables: str) -> str:
    """The expression as Grafana would send it: $var / ${var} replaced (defaults: all policies, short ranges)."""
    values = {**GRAFANA_DEFAULTS, **variables}

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", substitute, expr)


# PromQL words that look like metric names but are not: keywords and the operators spelled as words.
_PROMQL_WORDS = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "inf", "nan", "atan2", "start", "end",
})
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*")
_HISTOGRAM_SUFFIX = re.compile(r"_(?:bucket|sum|count)$")


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded-series) names an expression selects, by a small lexical reading of PromQL.

    Removes strings, label matchers {…}, ranges […], label lists of by/without/on/ignoring/group_*, and
    Grafana variables; what remains that is an identifier not followed by "(" and not a keyword is a name.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"#[^\n]*", "", text)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = _LABEL_LIST.sub(" ", text)
    text = re.sub(r"\$\{\w+\}|\$\w+", " ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        if word.lower() in _PROMQL_WORDS:
            continue
        if re.match(r"\s*\(", text[match.end():]):
            continue  # a function or an aggregation
        names.add(word)
    return names


def base_metric(name: str) -> str:
    """egressd_request_duration_seconds_bucket -> egressd_request_duration_seconds (histogram series)."""
    return _HISTOGRAM_SUFFIX.sub("", name)
