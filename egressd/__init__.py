"""egressd: a TLS-terminating forward egress proxy for sandboxes that run untrusted code."""

__version__ = "0.1.0"
