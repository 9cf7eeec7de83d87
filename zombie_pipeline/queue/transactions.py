"""A batch's writes in one transaction where the server runs them, one after another where it does not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pymongo
from pymongo import MongoClient
from pymongo.client_session import ClientSession

T = TypeVar("T")

_transactions: dict[int, bool] = {}


def supports_transactions(client: MongoClient[Any]) -> bool:
    """Whether the server runs transactions: a replica set or a sharded cluster does, a standalone does not."""
    key = id(client)
    if key not in _transactions:
        hello = client.admin.command("hello")
        _transactions[key] = bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"
    return _transactions[key]


def in_transactions(client: MongoClient[Any], enabled: bool) -> bool:
    """Whether :func:`atomically` runs its work in a transaction on ``client``: asked for, and the server has them."""
    return enabled and supports_transactions(client)


class Conflict(Exception):
    """Raised by a transaction's work when a concurrent writer got there first: the work is done again."""


def atomically(
    client: MongoClient[Any], work: Callable[[ClientSession | None], T], enabled: bool = True, attempts: int = 5
) -> T:
    """``work(session)`` in one transaction where asked and the server has them, else ``work(None)``.

    A write conflict with a worker (or a :class:`Conflict` the work raises) starts the transaction
    again, a few times: ``work`` computes everything from what it reads. Anything else, a lost
    connection above all, is raised at once: the work is recognized as done or not by the next run,
    and a dead server must not hold a cleanup for minutes.
    """
    if not in_transactions(client, enabled):
        return work(None)
    for attempt in range(attempts):
        with client.start_session() as session:
            session.start_transaction()
            try:
                result = work(session)
                session.commit_transaction()
                return result
            except (Conflict, pymongo.errors.OperationFailure) as error:
                _abort(session)
                transient = isinstance(error, Conflict) or error.has_error_label("TransientTransactionError")
                if not transient or attempt == attempts - 1:
                    raise
            except BaseException:
                _abort(session)
                raise
    raise AssertionError("unreachable")


def _abort(session: ClientSession) -> None:
    try:
        if session.in_transaction:
            session.abort_transaction()
    except pymongo.errors.PyMongoError:
        pass  # the server aborts it after its lifetime anyway
