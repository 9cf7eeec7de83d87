"""Dates as BSON keeps them: aware UTC, to the millisecond."""

from __future__ import annotations

import datetime as dt
from typing import Any


def utc_now() -> dt.datetime:
    """Now at BSON's millisecond precision: a stamp written and read back compares equal."""
    return truncate_ms(dt.datetime.now(dt.UTC))


def truncate_ms(moment: dt.datetime) -> dt.datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def as_utc(value: Any) -> dt.datetime | None:
    """A stored date as an aware UTC datetime; None for anything that is not a date."""
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def utc(value: Any) -> dt.datetime:
    """:func:`as_utc` of a value already checked to be a date (a well-formed job's ``started_at``)."""
    moment = as_utc(value)
    if moment is None:
        raise TypeError(f"expected a date, got {type(value).__name__}")
    return moment
