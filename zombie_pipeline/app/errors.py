"""What a command refuses before it does anything, and how a database error met on the way is said: in one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pymongo

from zombie_pipeline.queue.connections import database_error


class OptionRefused(ValueError):
    """Options that make no sense together, or have no effect as given; the message names them as typed."""


class Progress:
    """What a command is doing now, and what the databases hold if it stops there.

    Called with each step (``progress("dropping the simulation")``); inside :meth:`watching`, a database error
    (a timeout, a lost connection, a refused command) becomes one line naming the command, that step, the masked
    URL and ``$ZOMBIE_MONGO_TIMEOUT_MS``, then ``then``: how to go on from there.
    """

    def __init__(
        self, command: str, urls: Sequence[str | None], timeout_ms: int | Mapping[str | None, int], then: str
    ) -> None:
        self.command = command
        self.urls = list(urls)
        self.timeout_ms = timeout_ms
        self.doing = "starting"
        self.then = then

    def __call__(self, doing: str) -> None:
        self.doing = doing

    @contextlib.contextmanager
    def watching(self) -> Iterator[Progress]:
        try:
            yield self
        except pymongo.errors.PyMongoError as error:
            raise database_error(
                error, f"{self.command}: {self.doing}", self.urls, self.timeout_ms, then=self.then
            ) from None


#: What a command says when a database error stops it before it wrote anything.
NOTHING_WRITTEN = "nothing was written"


def cut_short(again: str) -> str:
    """What a command that writes a simulation says when a database error stops it: how to start ``again``."""
    return f"what the databases hold stays marked as the simulator's: {again} starts again"


def progress_of(command: str, resources: Any, then: str = NOTHING_WRITTEN) -> Progress:
    """A command's :class:`Progress` on the databases of ``resources``: their URLs and each one's timeout."""
    databases = resources["databases"]
    return Progress(command, databases.urls(), databases.timeouts(), then)
