#!/usr/bin/python3 -IS
"""/usr/bin/egressd: egressd from its private library directory.

`-I` keeps PYTHON* variables, the user's site-packages and the script's directory out of sys.path; `-S` (no
`site`) keeps out the host's site-packages too (/usr/lib/python3/dist-packages, /usr/local/...), so only
/usr/lib/egressd and the standard library are ever imported. A subcommand given no --config gets the package's
/etc/egressd/egressd.toml (with its conf.d drop-ins), so `egressd token mint --policy P` talks to the service.
"""

import os
import sys

LIBDIR = "/usr/lib/egressd"
CONFIG = "/etc/egressd/egressd.toml"
# The words of every subcommand that takes --config FILE after them.
LEAVES = {
    ("serve",), ("run",), ("ca", "cert"), ("policy", "check"), ("policy", "reload"), ("policy", "explain"),
    ("token", "mint"), ("token", "revoke"), ("token", "list"),
}


def names_config(arg: str) -> bool:
    """--config, --config=FILE, or an abbreviation argparse would take for it (--conf)."""
    name = arg.partition("=")[0]
    return len(name) > 3 and "--config".startswith(name)


def with_default_config(argv: list[str], config: str = CONFIG) -> list[str]:
    """argv with `--config CONFIG` after the subcommand's words when none is given (before any `--`)."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    if any(names_config(arg) for arg in own) or not os.path.exists(config):
        return argv
    for words in (2, 1):
        if tuple(argv[:words]) in LEAVES:
            return [*argv[:words], "--config", config, *argv[words:]]
    return argv


if __name__ == "__main__":
    sys.path.insert(0, LIBDIR)
    from egressd.cli import main

    sys.exit(main(with_default_config(sys.argv[1:])))
