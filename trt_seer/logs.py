"""Quieting other libraries' expected chatter without touching the application's logging setup.

    from trt_seer.logs import quieted
    with quieted("torch.onnx"):       # its records below ERROR are dropped inside the block only
        torch.onnx.export(...)

Library code never sets a logger's level (the application owns levels and handlers; the CLI
configures them). `quieted` adds a filter for the block instead, which drops only the named
library's records (None: those logged on the root logger itself, by libraries that call
`logging.warning`): on the named logger and its children, and on the handlers its records reach
(children created inside the block, as lazily imported modules make them, are caught there).
"""
from __future__ import annotations

import contextlib
import logging


def _from(record_name: str, name: str | None) -> bool:
    if name is None:
        return record_name == "root"
    return record_name == name or record_name.startswith(name + ".")


class _Below(logging.Filter):
    """Drops the records of loggers `names` under `level`; passes every other record."""

    def __init__(self, names: tuple, level: int):
        super().__init__()
        self.names, self.level = names, level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or not any(_from(record.name, n) for n in self.names)


class _ToDebug(_Below):
    """Like _Below, but each dropped record is said once at DEBUG on logger `to` (seen with -v)."""

    def __init__(self, names: tuple, level: int, to: logging.Logger):
        super().__init__(names, level)
        self.to, self.said = to, set()

    def filter(self, record: logging.LogRecord) -> bool:
        if super().filter(record):
            return True
        if id(record) not in self.said:  # the filter sits on loggers and handlers: one line per record
            self.said.add(id(record))
            self.to.debug("%s: %s", record.name, record.getMessage())
        return False


def _targets(name: str | None) -> list:
    """The logger `name`, its children now, and the handlers its records reach."""
    logger = logging.getLogger(name)
    loggers = [logger] + [lg for key, lg in list(logging.Logger.manager.loggerDict.items())
                          if name is not None and key.startswith(name + ".") and isinstance(lg, logging.Logger)]
    handlers, lg = [h for child in loggers for h in child.handlers], logger
    while lg is not None:
        handlers += lg.handlers
        lg = lg.parent if lg.propagate else None
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    return loggers + handlers


@contextlib.contextmanager
def quieted(*names: str | None, below: int = logging.ERROR, debug_to: logging.Logger | None = None):
    """Drops records under `below` from the loggers `names` (None: the root logger) in the block;
    with `debug_to`, each is said there at DEBUG instead (`-v` shows it)."""
    drop = _Below(names, below) if debug_to is None else _ToDebug(names, below, debug_to)
    targets = list({id(t): t for name in names for t in _targets(name)}.values())
    for target in targets:
        target.addFilter(drop)
    try:
        yield
    finally:
        for target in targets:
            target.removeFilter(drop)
