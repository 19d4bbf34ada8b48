"""The mitmproxy addons of egressd: one hook-driven class per concern, all thin over `Service`."""

from egressd.addons.connect_gate import ConnectGate
from egressd.addons.reply_scrubber import ReplyScrubber
from egressd.addons.request_gate import RequestGate
from egressd.addons.request_ledger import RequestLedger
from egressd.addons.run_reaper import RunReaper
from egressd.addons.upstream_pin import UpstreamPin

__all__ = ["ConnectGate", "ReplyScrubber", "RequestGate", "RequestLedger", "RunReaper", "UpstreamPin"]
