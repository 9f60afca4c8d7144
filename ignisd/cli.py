"""The `ignisd` command: `ignisd serve [flags]` runs the daemon (DESIGN §6); `ignisd install-unit` installs the systemd
units (ignisd.install_unit); `ignisd lint` lints a trace offline (ignisd.lint).

Exit codes of serve: 0 after a clean stop, 2 for a configuration value that is refused, 1 for anything else that
stops the start (a model that cannot be loaded, another daemon on the socket).
"""
from __future__ import annotations

import asyncio
import sys

from ignisd.config import ConfigError, parse_serve_args

USAGE = ("usage: ignisd serve [--config FILE] [--model PATH] [--socket PATH] [--section-key VALUE ...]\n"
         "       ignisd install-unit [--root DIR] [--config PATH] [--ignisd PATH] [--no-reload]\n"
         "       ignisd lint [--model PATH] TRACE [--json] [--prefill-rate TOK_S]   (no daemon; tokenizer only)\n"
         "Every configuration key section.key_name has the flag --section-key-name (see README).")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ignisd` command. Returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "install-unit":
        from ignisd.install_unit import main as install_main
        return install_main(argv[1:])
    if argv[0] == "lint":
        from ignisd.lint import main as lint_main
        return lint_main(argv[1:])
    if argv[0] != "serve":
        print(f"ignisd: unknown command {argv[0]!r}; the commands are `ignisd serve`, `ignisd install-unit` and "
              "`ignisd lint`",
              file=sys.stderr)
        return 2
    import signal
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # a reload sent while torch imports must not kill the start
    from ignisd.torch_threads import one_thread_by_default
    one_thread_by_default()                        # before torch loads: only the forward worker runs it wide
    from ignisd.log import setup_logging, stderr_message
    try:
        cfg = parse_serve_args(argv[1:])
    except ConfigError as e:
        print(stderr_message(f"ignisd: configuration error: {e}"), file=sys.stderr)
        return 2
    setup_logging(cfg.server.log_level)
    from ignisd.daemon import Daemon
    from ignisd.preflight import StartupError
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        daemon = Daemon(cfg, argv[1:])
        run(daemon.run())
    except StartupError as e:
        print(stderr_message(f"ignisd: {e}"), file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
