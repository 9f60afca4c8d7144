"""`ignisd serve [flags]`: parse the configuration (DESIGN §6) and run the daemon."""
from __future__ import annotations

import asyncio
import sys

from ignisd.config import ConfigError, parse_serve_args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ignisd` command. Returns the process exit code (2 for a configuration error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: ignisd serve [--config FILE] [--model PATH] [--socket PATH] [--section-key VALUE ...]\n"
              "Every configuration key section.key_name has the flag --section-key-name (see README).")
        return 0 if argv else 2
    if argv[0] != "serve":
        print(f"ignisd: unknown command {argv[0]!r}; the command is `ignisd serve`", file=sys.stderr)
        return 2
    try:
        cfg = parse_serve_args(argv[1:])
    except ConfigError as e:
        print(f"ignisd: configuration error: {e}", file=sys.stderr)
        return 2
    from ignisd.log import setup_logging
    setup_logging(cfg.server.log_level)
    from ignisd.daemon import Daemon
    from ignisd.preflight import StartupError
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        daemon = Daemon(cfg)
        run(daemon.run())
    except StartupError as e:
        print(f"ignisd: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
