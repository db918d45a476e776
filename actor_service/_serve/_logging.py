"""Structured logs of the actor: one event name plus fields, as text or one JSON object per line.

Every record the actor emits goes through :func:`log_event`, which attaches an
event name (``session.opened``, ``weights.pushed`` …) and key/value fields.
:func:`configure_logging` installs a stderr handler on the ``rlfleet`` logger
that renders them either as ``text`` (``ts LEVEL event key=value …``) or as
``json`` (``{"ts", "level", "event", "worker_id", "fields"}``), so log
collectors can parse actor output without regular expressions.

A field's text is cut at :data:`MAX_FIELD_CHARS` (its length said after the cut): fields
carry what peers sent (ids, error messages quoting them), and a peer must not make one
short request write megabytes of log.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, TextIO

__all__ = ["LOGGER_NAME", "MAX_FIELD_CHARS", "configure_logging", "get_logger", "log_event"]

LOGGER_NAME = "rlfleet.actor"
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_FORMATS = ("text", "json")
#: The most characters of one field's text a log line keeps.
MAX_FIELD_CHARS = 2000


def get_logger() -> logging.Logger:
    """Return the actor's logger."""
    return logging.getLogger(LOGGER_NAME)


def log_event(
    event: str, level: int = logging.INFO, /, *, exc_info: bool = False, **fields: Any
) -> None:
    """Log one structured event.

    Args:
        event: Dotted event name, e.g. ``"session.opened"``.
        level: A ``logging`` level.
        exc_info: Attach the exception being handled (its traceback stays in the log).
        **fields: Values worth searching for (peer, seq, model_id …); keep them small.
    """
    logger = get_logger()
    if logger.isEnabledFor(level):
        logger.log(
            level,
            event,
            exc_info=exc_info,
            extra={"rlfleet_event": event, "rlfleet_fields": fields},
        )


class _Formatter(logging.Formatter):
    """Renders records as text or JSON with the worker id on every line."""

    def __init__(self, fmt: str, worker_id: int) -> None:
        super().__init__()
        self._json = fmt == "json"
        self._worker_id = worker_id

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        event = getattr(record, "rlfleet_event", None)
        if event is not None:
            fields = {k: _cut(v) for k, v in getattr(record, "rlfleet_fields", {}).items()}
        else:  # a record of another library (gRPC, asyncio, warnings)
            event, fields = "log", {"logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        if self._json:
            return json.dumps(
                {
                    "ts": ts.isoformat(timespec="milliseconds"),
                    "level": record.levelname.lower(),
                    "event": event,
                    "worker_id": self._worker_id,
                    "fields": fields,
                },
                default=str,
            )
        pairs = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        line = f"{ts.strftime('%H:%M:%S.%f')[:-3]} {record.levelname:<7} worker={self._worker_id} "
        return (line + f"{event} {pairs}").rstrip()


def _cut(value: Any) -> Any:
    """``value``, or its text cut at :data:`MAX_FIELD_CHARS` when longer."""
    if isinstance(value, bool | int | float | None):
        return value
    text = value if isinstance(value, str) else str(value)
    if len(text) <= MAX_FIELD_CHARS:
        return value
    return f"{text[:MAX_FIELD_CHARS]}... ({len(text)} characters)"


def _text_value(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c.isspace() for c in text)) else text


def configure_logging(
    level: str = "info",
    fmt: str = "text",
    *,
    worker_id: int = 0,
    stream: TextIO | None = None,
    include_others: bool = False,
) -> logging.Handler:
    """Send the actor's logs to ``stream`` (stderr by default) in the given format.

    Replaces a handler installed by an earlier call, so it is safe to call twice.

    Args:
        level: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``.
        fmt: ``"text"`` or ``"json"``.
        worker_id: Written on every line.
        stream: Where to write.
        include_others: Also render other libraries' warnings and errors (root
            logger) in the same format, so a JSON log holds nothing but JSON lines.

    Returns:
        The installed handler.

    Raises:
        ValueError: ``level`` or ``fmt`` is not one of the choices.
    """
    if level not in _LEVELS:
        raise ValueError(f"log level must be one of {sorted(_LEVELS)}, got {level!r}")
    if fmt not in _FORMATS:
        raise ValueError(f"log format must be one of {list(_FORMATS)}, got {fmt!r}")
    logger, root = get_logger(), logging.getLogger()
    for owner in (logger, root):
        for old in [h for h in owner.handlers if getattr(h, "_rlfleet", False)]:
            owner.removeHandler(old)
    handler = _handler(stream, fmt, worker_id)
    logger.addHandler(handler)
    logger.setLevel(_LEVELS[level])
    logger.propagate = False
    if include_others:
        others = _handler(stream, fmt, worker_id)
        others.setLevel(logging.WARNING)
        root.addHandler(others)
    return handler


def _handler(stream: TextIO | None, fmt: str, worker_id: int) -> logging.Handler:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_Formatter(fmt, worker_id))
    handler._rlfleet = True  # type: ignore[attr-defined]  # marks ours for replacement
    return handler
