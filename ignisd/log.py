"""Component-tagged, journald-friendly log lines on top of the standard ``logging`` module. †: imports no torch.

One record is one line ``LEVEL component event key=value ...``, e.g. ``INFO srv accepted id=r1 conn=3``.
Values: None → ``-``, booleans ``true``/``false``, floats with at most 3 decimals, strings bare unless they are empty
or hold a space, ``"``, ``=``, ``\\`` or a control character, in which case they are JSON-quoted
(``text="hello world"``); lists and dicts as compact JSON, quoted by the same rule. Under systemd (stderr is the
journal stream named by ``$JOURNAL_STREAM``) every line starts with its syslog priority ``<3>`` error, ``<4>``
warning, ``<6>`` info, ``<7>`` debug, which journald strips and records as the entry's priority, and no timestamp
(journald stamps each entry itself). ``parse_line`` reads a line back (``journalctl -u ignisd -o cat`` output
included) into its level, component, event and fields.
"""
from __future__ import annotations

import enum
import json
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, TextIO

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
_NAMES = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR",
          logging.CRITICAL: "CRITICAL"}
ROOT = "ignis"
_QUOTE_CHARS = frozenset(' "=\\')


def format_value(v: Any) -> str:
    """One value in the line's key=value syntax (see the module docstring)."""
    if isinstance(v, enum.Enum):
        v = v.value
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        s = f"{v:.3f}".rstrip("0").rstrip(".")
        return "0" if s == "-0" else s
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (list, tuple, dict)):
        s = json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=str)
    else:
        s = str(v)
    if s == "" or any(c in _QUOTE_CHARS or ord(c) < 0x20 or c == "\x7f" for c in s):
        return json.dumps(s, ensure_ascii=False)
    return s


def format_fields(**fields: Any) -> str:
    """``key=value`` pairs in the given order, separated by single spaces."""
    return " ".join(f"{k}={format_value(v)}" for k, v in fields.items())


def format_line(levelno: int, component: str, event: str, fields: Mapping[str, Any], journal: bool = False) -> str:
    """The whole line for one record, without the trailing newline."""
    parts = [_NAMES.get(levelno, str(levelno)), component, event]
    if fields:
        parts.append(format_fields(**fields))
    line = " ".join(parts)
    return f"<{PRIORITY.get(levelno, 6)}>{line}" if journal else line


def journal_stream_active(env: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """True when ``fd`` is the journald stream that systemd named in $JOURNAL_STREAM ("device:inode")."""
    env = os.environ if env is None else env
    value = env.get("JOURNAL_STREAM")
    if not value:
        return False
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(fd)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


@dataclass(frozen=True)
class ParsedLine:
    """One log line read back: priority (the journald prefix's number, None without one), level name, component,
    event and the fields in order (values typed back: ``-`` None, true/false, ints, floats, JSON lists and dicts,
    strings)."""

    priority: int | None
    level: str
    component: str
    event: str
    fields: dict[str, Any]


_NUMBER = re.compile(r"-?\d+(\.\d+)?")
_DECODER = json.JSONDecoder()


def _typed(raw: str) -> Any:
    if raw == "-":
        return None
    if raw in ("true", "false"):
        return raw == "true"
    if _NUMBER.fullmatch(raw):
        return float(raw) if "." in raw else int(raw)
    if raw in ("nan", "inf", "-inf"):
        return float(raw)
    if raw[:1] in "[{":
        try:
            return json.loads(raw)
        except ValueError:
            pass
    return raw


def parse_line(line: str) -> ParsedLine:
    """Read back a line written by LineFormatter (without its trailing newline). Raises ValueError when the line is
    not one (too few words, a field without ``=``, a broken quoted value)."""
    priority = None
    if m := re.match(r"<(\d)>", line):
        priority, line = int(m.group(1)), line[m.end():]
    head = line.split(" ", 3)
    if len(head) < 3:
        raise ValueError(f"not an ignis log line: {line!r}")
    level, component, event = head[:3]
    rest = head[3] if len(head) == 4 else ""
    fields: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        eq = rest.find("=", i)
        if eq < 0:
            raise ValueError(f"field without '=' at {rest[i:]!r}")
        key = rest[i:eq]
        if rest[eq + 1:eq + 2] == '"':
            value, end = _DECODER.raw_decode(rest, eq + 1)
            value = _typed(value) if value[:1] in "[{" else value
        else:
            end = rest.find(" ", eq + 1)
            end = len(rest) if end < 0 else end
            value = _typed(rest[eq + 1:end])
        fields[key] = value
        i = end + 1
    return ParsedLine(priority, level, component, event, fields)


class LineFormatter(logging.Formatter):
    """Formats ``ignis.*`` records made by ComponentLogger and any other library's records (component = logger name,
    event ``log``, the message in ``msg=``). A traceback follows as extra lines, each with the same prefix."""

    def __init__(self, journal: bool = False, timestamps: bool = False):
        super().__init__()
        self.journal, self.timestamps = journal, timestamps

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "ignis_fields", None)
        if fields is not None:
            component, event = record.name.removeprefix(ROOT + "."), record.getMessage()
        else:
            component, event, fields = record.name, "log", {"msg": record.getMessage()}
        line = format_line(record.levelno, component, event, fields, self.journal)
        if self.timestamps:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
            line = line.replace(">", f">{stamp} ", 1) if self.journal else f"{stamp} {line}"
        if record.exc_info:
            prefix = f"<{PRIORITY.get(record.levelno, 6)}>" if self.journal else ""
            tb = self.formatException(record.exc_info)
            line += "".join(f"\n{prefix}  {t}" for t in tb.splitlines())
        return line


class ComponentLogger:
    """Logger of one component (``srv``, ``sched``, ``cache``, ``model``...). ``log.info("accepted", id="r1")``
    writes ``INFO srv accepted id=r1``. Fields are formatted only when the level is enabled."""

    def __init__(self, component: str):
        self.component = component
        self.logger = logging.getLogger(f"{ROOT}.{component}")

    def _log(self, level: int, event: str, fields: dict, exc_info: Any = None) -> None:
        if self.logger.isEnabledFor(level):
            self.logger.log(level, event, extra={"ignis_fields": fields}, exc_info=exc_info, stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """error() plus the current exception's traceback (call inside ``except``)."""
        self._log(logging.ERROR, event, fields, exc_info=True)

    def enabled(self, level: str) -> bool:
        return self.logger.isEnabledFor(LEVELS[level])


def get_logger(component: str) -> ComponentLogger:
    """The logger of ``component``; lines are written once setup_logging() installed the handler."""
    return ComponentLogger(component)


_handler: logging.Handler | None = None


def setup_logging(level: str = "info", stream: TextIO | None = None, journal: bool | None = None,
                  timestamps: bool = False) -> logging.Handler:
    """Install the one line handler on the root logger (replacing an earlier one from this function).

    level: debug | info | warning | error for ignis components; other libraries log at warning and above (or at
    ``level`` when it is higher). stream: default sys.stderr. journal: priority prefixes; None detects the journal
    from $JOURNAL_STREAM and stderr. Raises ValueError on an unknown level.
    """
    global _handler
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    stream = sys.stderr if stream is None else stream
    if journal is None:
        journal = stream is sys.stderr and journal_stream_active()
    logging.captureWarnings(True)     # Python warnings become lines of this format too (component py.warnings)
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = logging.StreamHandler(stream)
    _handler.setFormatter(LineFormatter(journal=journal, timestamps=timestamps))
    root.addHandler(_handler)
    lvl = LEVELS[level]
    root.setLevel(max(lvl, logging.WARNING))
    logging.getLogger(ROOT).setLevel(lvl)
    return _handler


def set_level(level: str) -> None:
    """Change the level of the ignis components at once (a SIGHUP reload of server.log_level). Raises ValueError
    on an unknown level."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    lvl = LEVELS[level]
    logging.getLogger().setLevel(max(lvl, logging.WARNING))
    logging.getLogger(ROOT).setLevel(lvl)


def stderr_message(text: str, priority: int = 3, env: Mapping[str, str] | None = None) -> str:
    """A message the command line prints on stderr outside the log handler (a start error): with the journald
    priority prefix when stderr is the journal stream, so `journalctl -p err` finds it too."""
    return f"<{priority}>{text}" if journal_stream_active(env) else text
