"""The watcher's lease: one watch run acts at the deadlines at a time, and anyone can tell whether one does.

One document in our own collection (``zombieWatchers``, ``_id`` ``watcher``). A watch run takes it when it has
lapsed (or was never taken), renews it from its own loop between passes, and lets it go when it ends. A run that
dies, or hangs in a pass, stops renewing it, so the lease lapses ``lease_seconds`` later whatever Dagster thinks of
the run: that lapse, not a run's status, is what the fallback cleanups (``stale_jobs_sensor``) and the relaunch
sensor read. A watcher that finds the lease taken from it (it slept through its own lapse and a successor took
over) stops at once.

Finalizations never depend on the lease: each one is claimed and finished by compare-and-set (``events``,
``strategies``), so two watchers, or a watcher and a cleanup, still finalize a job once. The lease only keeps a
second watcher from doing the same work twice.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pymongo.collection import Collection
from pymongo.errors import DuplicateKeyError

from zombie_pipeline.queue.audit_documents import WATCH_LEASE_ID, WatchLease, WatchLeaseDocument, WatchState
from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.queue.times import as_utc


@dataclass(frozen=True)
class LeaseView:
    """The lease as read: who holds it, until when, and what it last said."""

    holder: str
    lease_until: dt.datetime
    renewed_at: dt.datetime | None
    ends_at: dt.datetime | None
    state: str
    watched: int | None
    next_deadline: dt.datetime | None
    finalized: int

    def alive(self, now: dt.datetime) -> bool:
        """Whether its holder renewed it recently enough: a watcher dead or hung has let it lapse."""
        return self.state != WatchState.ENDED and self.lease_until > now

    def describe(self, now: dt.datetime) -> str:
        """One line for a sensor's skip reason or a log."""
        renewed = f"renewed {(now - self.renewed_at).total_seconds():.0f} s ago" if self.renewed_at else "never renewed"
        line = f"watch run {self.holder} is {self.state} ({renewed}, lease until {self.lease_until:%H:%M:%S} UTC"
        if self.ends_at is not None:
            line += f", hands over at {self.ends_at:%H:%M:%S} UTC"
        line += f"; {self.finalized} finalized"
        if self.watched is not None:
            line += f", {self.watched} started jobs watched"
        if self.next_deadline is not None:
            line += f", next deadline {self.next_deadline:%H:%M:%S} UTC"
        return line + ")"


def read(watchers: Collection[WatchLeaseDocument]) -> LeaseView | None:
    """The lease, or None where no watcher ever took it (or what the document holds is not one)."""
    document = watchers.find_one({ID: WATCH_LEASE_ID})
    if document is None:
        return None
    lease_until = as_utc(document.get(WatchLease.LEASE_UNTIL))
    holder = document.get(WatchLease.HOLDER)
    if lease_until is None or not isinstance(holder, str):
        return None
    watched = document.get(WatchLease.WATCHED)
    return LeaseView(
        holder=holder,
        lease_until=lease_until,
        renewed_at=as_utc(document.get(WatchLease.RENEWED_AT)),
        ends_at=as_utc(document.get(WatchLease.ENDS_AT)),
        state=str(document.get(WatchLease.STATE, WatchState.WATCHING)),
        watched=watched if isinstance(watched, int) else None,
        next_deadline=as_utc(document.get(WatchLease.NEXT_DEADLINE)),
        finalized=int(document.get(WatchLease.FINALIZED) or 0),
    )


def alive_watcher(watchers: Collection[WatchLeaseDocument], now: dt.datetime) -> LeaseView | None:
    """The watcher acting now, if any: a lease renewed and not lapsed."""
    lease = read(watchers)
    return lease if lease is not None and lease.alive(now) else None


def acquire(
    watchers: Collection[WatchLeaseDocument], run_id: str, now: dt.datetime, lease_seconds: float, ends_at: dt.datetime
) -> bool:
    """Take the lease if it lapsed, was let go or never existed (or is already ``run_id``'s); whether it is ours now.

    One upsert: where another holds a live lease the filter matches nothing and the insert of the same ``_id`` is
    refused. Repeated after a lost reply, it matches the holder, ``run_id``: safe to repeat.
    """
    free = {
        "$or": [
            {WatchLease.LEASE_UNTIL: {"$lte": now}},
            {WatchLease.STATE: WatchState.ENDED},
            {WatchLease.HOLDER: run_id},
        ]
    }
    taken: dict[str, Any] = {
        WatchLease.HOLDER: run_id,
        WatchLease.SINCE: now,
        WatchLease.ENDS_AT: ends_at,
        WatchLease.FINALIZED: 0,
        **_renewal(now, lease_seconds, WatchState.WATCHING),
    }
    try:
        watchers.update_one({ID: WATCH_LEASE_ID, **free}, {"$set": taken}, upsert=True)
    except DuplicateKeyError:
        return False
    return True


def renew(
    watchers: Collection[WatchLeaseDocument],
    run_id: str,
    now: dt.datetime,
    lease_seconds: float,
    state: WatchState,
    **facts: Any,
) -> bool:
    """Extend the lease of ``run_id`` with what it says of itself (``facts``: :class:`WatchLease`'s fields); False when
    it is no longer ``run_id``'s (taken over after it lapsed)."""
    change = {**_renewal(now, lease_seconds, state), **facts}
    updated = watchers.update_one({ID: WATCH_LEASE_ID, WatchLease.HOLDER: run_id}, {"$set": change})
    return updated.matched_count == 1


def release(watchers: Collection[WatchLeaseDocument], run_id: str, now: dt.datetime, **facts: Any) -> None:
    """Let the lease go, at once: a successor waiting for it takes it at its next look."""
    change = {WatchLease.STATE: WatchState.ENDED, WatchLease.LEASE_UNTIL: now, WatchLease.RENEWED_AT: now, **facts}
    watchers.update_one({ID: WATCH_LEASE_ID, WatchLease.HOLDER: run_id}, {"$set": change})


def _renewal(now: dt.datetime, lease_seconds: float, state: WatchState) -> dict[str, Any]:
    return {
        WatchLease.LEASE_UNTIL: now + dt.timedelta(seconds=lease_seconds),
        WatchLease.RENEWED_AT: now,
        WatchLease.STATE: state,
    }
