"""The `egressd` command line (a contract: words, flags and JSON output are what scripts are written against)."""

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from egressd import __version__
from egressd.ca import CERT, CAError
from egressd.config import Config, ConfigError, load_config
from egressd.control import ControlError, call
from egressd.policy import PolicyError, parse_policy
from egressd.sandbox import HOME

# Where the Debian package puts the config: used when no --config is given and it exists.
INSTALLED_CONFIG = Path("/etc/egressd/egressd.toml")


def _config_file(args: argparse.Namespace) -> Path | None:
    if args.config:
        return Path(args.config)
    return INSTALLED_CONFIG if INSTALLED_CONFIG.exists() else None


def _config(args: argparse.Namespace) -> Config:
    return load_config(_config_file(args))


def _control(args: argparse.Namespace, request: dict[str, object]) -> object:
    config = _config(args)
    return call(config.path(config.control.socket), request)


def _print_json(value: object) -> None:
    print(json.dumps(value, ensure_ascii=False))


def _policy_ref(text: str) -> tuple[str, int | None]:
    name, sep, version = text.partition("@")
    if not sep:
        return name, None
    if not (version.isascii() and version.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: the version after '@' must be a number")
    return name, int(version)


def cmd_serve(args: argparse.Namespace) -> int:
    from egressd.daemon import StartupError, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    config = _config(args)
    try:
        return asyncio.run(serve(config))
    except (StartupError, CAError) as err:
        print(f"egressd: {err}", file=sys.stderr)
        return 1


def cmd_ca_cert(args: argparse.Namespace) -> int:
    config = _config(args)
    path = config.path(config.paths.ca) / CERT
    try:
        sys.stdout.write(path.read_text())
    except OSError:
        print(f"egressd: no CA certificate at {path}; `egressd serve` makes the CA on first start",
              file=sys.stderr)
        return 1
    return 0


def cmd_policy_check(args: argparse.Namespace) -> int:
    failed = False
    for file in args.files:
        try:
            policy = parse_policy(Path(file).read_text(encoding="utf-8"), file)
        except PolicyError as err:
            print(err, file=sys.stderr)
            failed = True
        except (OSError, UnicodeDecodeError) as err:
            print(f"{file}: cannot read: {err}", file=sys.stderr)
            failed = True
        else:
            print(f"{file}: ok: {policy.label} sha256 {policy.sha256}")
    return 1 if failed else 0


def cmd_policy_reload(args: argparse.Namespace) -> int:
    result = _control(args, {"op": "reload"})
    assert isinstance(result, dict)
    for problem in result["problems"]:
        print(problem, file=sys.stderr)
    if result["ok"]:
        print("reloaded: " + ", ".join(result["loaded"]))
        return 0
    print("policies NOT reloaded; still serving: " + ", ".join(result["loaded"]), file=sys.stderr)
    return 1


def cmd_policy_explain(args: argparse.Namespace) -> int:
    name, version = args.policy
    _print_json(_control(args, {"op": "explain", "policy": name, "version": version,
                                "method": args.method, "url": args.url}))
    return 0


class CliError(ValueError):
    """A command line that cannot be carried out; the message says why."""


def _secret_values(specs: list[str]) -> dict[str, str]:
    """`NAME=@FILE` or `NAME=-` (stdin) → {NAME: value}. A value on the command line itself is refused."""
    values: dict[str, str] = {}
    for spec in specs:
        name, sep, source = spec.partition("=")
        if not sep or not name:
            raise CliError(f"--secret {name or spec}: expected NAME=@FILE or NAME=- (stdin)")
        if source == "-":
            value = sys.stdin.read()
        elif source.startswith("@"):
            try:
                value = Path(source[1:]).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise CliError(f"--secret {name}: cannot read {source[1:]}: {err}") from None
        else:
            # Deliberately not echoing the value: it may already be in this shell's history.
            raise CliError(f"--secret {name}: a value on the command line is visible to every local user "
                           "(ps, /proc/*/cmdline); give it as NAME=@FILE or NAME=- (stdin)")
        if name in values:
            raise CliError(f"--secret {name} is given twice")
        values[name] = value.removesuffix("\n").removesuffix("\r")
    return values


def cmd_token_mint(args: argparse.Namespace) -> int:
    secrets = _secret_values(args.secret)
    _print_json(_control(args, {"op": "mint", "policy": args.policy, "version": args.version,
                                "ttl": args.ttl, "label": args.label, "secrets": secrets}))
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    _print_json(_control(args, {"op": "revoke", "run_id": args.run_id}))
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    result = _control(args, {"op": "list"})
    assert isinstance(result, list)
    for run in result:
        _print_json(run)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from egressd.launcher import LaunchError, RunRequest, launch, parse_size, print_outcome

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise CliError("egressd run: give the command after --")
    name, version = args.policy
    try:
        request = RunRequest(policy=name, version=version, command=command, secrets=_secret_values(args.secret),
                             timeout=args.timeout, memory=parse_size(args.memory), pids=args.pids,
                             ro=[Path(p) for p in args.ro], rw=[Path(p) for p in args.rw],
                             workdir=args.workdir or HOME, require_seccomp=args.require_seccomp)
        if not 0 < request.timeout <= 7 * 24 * 3600 or request.pids < 1:
            raise LaunchError("--timeout must be 1 s to 7 days and --pids at least 1")
        outcome = launch(_config(args), _config_file(args), request)
    except LaunchError as err:
        raise CliError(str(err)) from None
    print_outcome(outcome, args.json)
    return outcome.exit_status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="egressd", description=__doc__)
    parser.add_argument("--version", action="version", version=f"egressd {__version__}")
    words = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def leaf(parent: argparse._SubParsersAction, name: str, handler, help_text: str) -> argparse.ArgumentParser:
        sub = parent.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--config", metavar="FILE",
                         help=f"config file (TOML); default: {INSTALLED_CONFIG} if it exists, else built-in defaults")
        sub.set_defaults(handler=handler)
        return sub

    leaf(words, "serve", cmd_serve, "run the proxy")

    ca = words.add_parser("ca", help="the CA").add_subparsers(dest="ca_command", required=True, metavar="WORD")
    leaf(ca, "cert", cmd_ca_cert, "print the CA certificate (PEM) that clients must trust")

    policy = words.add_parser("policy", help="policies").add_subparsers(dest="policy_command", required=True,
                                                                         metavar="WORD")
    check = leaf(policy, "check", cmd_policy_check, "check policy files; exit 1 with precise errors")
    check.add_argument("files", nargs="+", metavar="FILE")
    leaf(policy, "reload", cmd_policy_reload, "reload the daemon's policies (all or nothing)")
    explain = leaf(policy, "explain", cmd_policy_explain,
                   "the decision the live gate would give a request (resolves DNS, sends nothing upstream)")
    explain.add_argument("--policy", required=True, type=_policy_ref, metavar="NAME[@VERSION]")
    explain.add_argument("method", metavar="METHOD")
    explain.add_argument("url", metavar="URL")

    token = words.add_parser("token", help="runs and their tokens").add_subparsers(dest="token_command",
                                                                                   required=True, metavar="WORD")
    mint = leaf(token, "mint", cmd_token_mint, "mint a run and its proxy token (printed once, as JSON)")
    mint.add_argument("--policy", required=True, metavar="NAME")
    mint.add_argument("--version", type=int, metavar="N", help="policy version; default: the highest loaded")
    mint.add_argument("--ttl", type=float, metavar="SECONDS", help="lifetime; default 3600")
    mint.add_argument("--label", default="", metavar="TEXT")
    mint.add_argument("--secret", action="append", default=[], metavar="NAME=@FILE|NAME=-",
                      help="a per-run secret value, from a file or stdin (never from the command line)")
    revoke = leaf(token, "revoke", cmd_token_revoke, "revoke a run; its tunnels close within a second")
    revoke.add_argument("run_id", metavar="RUN_ID")
    leaf(token, "list", cmd_token_list, "list runs as JSON lines (never tokens)")

    run = leaf(words, "run", cmd_run, "run a command in a sandbox that can reach nothing but egressd")
    run.add_argument("--policy", required=True, type=_policy_ref, metavar="NAME[@VERSION]")
    run.add_argument("--secret", action="append", default=[], metavar="NAME=@FILE|NAME=-")
    run.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS", help="default 300")
    run.add_argument("--memory", default="512M", metavar="SIZE", help="default 512M")
    run.add_argument("--pids", type=int, default=256, metavar="N", help="default 256")
    run.add_argument("--ro", action="append", default=[], metavar="PATH", help="bind PATH read-only")
    run.add_argument("--rw", action="append", default=[], metavar="PATH", help="bind PATH read-write")
    run.add_argument("--workdir", metavar="PATH", help=f"default {HOME}")
    run.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    run.add_argument("--require-seccomp", action="store_true", help="fail when no seccomp filter can be built")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ConfigError, ControlError, CliError) as err:
        print(f"egressd: {err}", file=sys.stderr)
        return 1 if isinstance(err, ControlError) else 2


if __name__ == "__main__":
    sys.exit(main())
