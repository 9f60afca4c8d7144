"""`ignisd install-unit`: render and install the systemd units, the service user and the configuration (issue 13).

†: imports no torch. The files come from the checkout's ``systemd/`` folder:

* ``ignisd.service`` with ``ExecStart=`` naming the real path of this ignisd (systemd-analyze verify refuses a
  missing binary) and the configuration file, ``TimeoutStopSec=`` above the configured shutdown grace, and
  ``AF_INET AF_INET6`` added to ``RestrictAddressFamilies=`` when server.http_listen or server.metrics_listen uses
  TCP; → ``/etc/systemd/system/ignisd.service``;
* ``ignisd.socket`` (socket activation, optional) → ``/etc/systemd/system/ignisd.socket``;
* ``ignis.sysusers.conf`` (user and group ``ignis``) → ``/etc/sysusers.d/ignis.conf``;
* ``ignisd.toml`` → the configuration path, only when no file is there, with ``socket_mode = "0660"`` and
  ``socket_group = "ignis"`` set so members of the group may connect.

With ``--root DIR`` everything is written under DIR and nothing is run; with the real root, ``systemd-sysusers`` and
``systemctl daemon-reload`` run afterwards (unless ``--no-reload``). The next steps are printed.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from .config import ServerConfig, config_from_toml
from .config_keys import ConfigError

UNITS_DIR = Path(__file__).resolve().parents[1] / "systemd"
DEFAULT_CONFIG = "/etc/ignis/ignisd.toml"
STOP_MARGIN_S = 30


def ignisd_path() -> str:
    """The absolute path of the ignisd command of this installation (beside this Python, else on $PATH). Raises
    FileNotFoundError when there is none."""
    beside = Path(sys.executable).parent / "ignisd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ignisd")
    if found:
        return str(Path(found).resolve())
    raise FileNotFoundError("no ignisd command beside this Python or on $PATH; pass --ignisd PATH")


def _server_config(config_text: str | None, config_path: str) -> ServerConfig:
    """The [server] settings of the configuration text, validated exactly as `ignisd serve --config` does (the
    defaults when config_text is None). Raises ConfigError naming the key (or --config for invalid TOML)."""
    try:
        doc = tomllib.loads(config_text) if config_text else {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", config_path, "valid TOML", problem=f"invalid TOML ({e}) in") from None
    return config_from_toml(doc, env={}, source=config_path).server


def render_service(template: str, ignisd: str, config_path: str = DEFAULT_CONFIG,
                   config_text: str | None = None, source: str | None = None) -> str:
    """The service unit for `ignisd` (an absolute path) reading `config_path`; config_text: that file's content
    (grace and listeners are read from it; None: the defaults). Raises ConfigError for a configuration the daemon
    would refuse (the key named; source: the file the text was read from, config_path when None), so no unit is
    written that fails at its first start."""
    server = _server_config(config_text, source or config_path)
    out = re.sub(r"^ExecStart=.*$", f"ExecStart={ignisd} serve --config {config_path}", template, flags=re.M)
    stop = max(60, int(server.shutdown_grace_s) + STOP_MARGIN_S)
    out = re.sub(r"^TimeoutStopSec=.*$", f"TimeoutStopSec={stop}", out, flags=re.M)
    tcp = [v for v in (server.http_listen, server.metrics_listen) if v is not None and not v.startswith("unix:")]
    if tcp:
        out = re.sub(r"^RestrictAddressFamilies=.*$", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", out,
                     flags=re.M)
    return out


def render_config(example: str) -> str:
    """The installed configuration: the example with the socket open to the group ignis."""
    out = example.replace('# socket_mode = "0600"', 'socket_mode = "0660"', 1)
    return out.replace('# socket_group = "off"', 'socket_group = "ignis"', 1)


def install(root: Path, ignisd: str, config_path: str = DEFAULT_CONFIG, units_dir: Path = UNITS_DIR) -> list[Path]:
    """Write the files under `root` (see the module docstring); returns the paths written (an existing
    configuration is kept). Raises OSError."""
    root = Path(root)
    cfg_file = root / config_path.lstrip("/")
    written = []
    if not cfg_file.exists():
        cfg_file.parent.mkdir(parents=True, exist_ok=True)
        cfg_file.write_text(render_config((units_dir / "ignisd.toml").read_text()))
        written.append(cfg_file)
    service = render_service((units_dir / "ignisd.service").read_text(), ignisd, config_path, cfg_file.read_text(),
                             str(cfg_file))
    targets = {root / "etc/systemd/system/ignisd.service": service,
               root / "etc/systemd/system/ignisd.socket": (units_dir / "ignisd.socket").read_text(),
               root / "etc/sysusers.d/ignis.conf": (units_dir / "ignis.sysusers.conf").read_text()}
    for path, text in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


NEXT_STEPS = """next:
  sudo systemctl enable --now ignisd          # or: enable --now ignisd.socket (socket activation)
  sudo usermod -aG ignis "$USER"              # let your editor use the socket (log in again)
  journalctl -u ignisd -f                     # the logs; a request's line: journalctl -u ignisd -g 'done id=ID'
"""


def main(argv: list[str]) -> int:
    """`ignisd install-unit [--root DIR] [--config PATH] [--ignisd PATH] [--no-reload]`; returns the exit code."""
    p = argparse.ArgumentParser(prog="ignisd install-unit", description="Install the systemd units of ignisd.")
    p.add_argument("--root", default="/", help="install under this directory (nothing is run unless it is /)")
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help=f"the configuration file the unit reads (default {DEFAULT_CONFIG}), taken under --root: "
                        "written there from the example when missing, else read to render the unit")
    p.add_argument("--ignisd", default=None, help="the ignisd command (default: this installation's)")
    p.add_argument("--no-reload", action="store_true", help="do not run systemd-sysusers / systemctl daemon-reload")
    args = p.parse_args(argv)
    try:
        exe = args.ignisd or ignisd_path()
        written = install(Path(args.root), str(Path(exe).resolve()), args.config)
    except (OSError, FileNotFoundError) as e:
        print(f"ignisd install-unit: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"ignisd install-unit: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    if Path(args.root).resolve() == Path("/") and not args.no_reload:
        for cmd in (["systemd-sysusers", "/etc/sysusers.d/ignis.conf"], ["systemctl", "daemon-reload"]):
            if shutil.which(cmd[0]):
                print("ran", " ".join(cmd), "->", subprocess.run(cmd).returncode)
    print(NEXT_STEPS, end="")
    return 0
