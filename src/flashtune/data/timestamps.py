"""Trace timestamps as times: which of two traces is the later one, and which time proves
nothing.

"The latest trace" decides what a re-run replaces (apply's winners, the reports), so it is
chosen by comparing parsed times, never the strings: "2026-11-27T10:00:00+14:00" sorts
after "2026-11-27T09:00:00Z" but is 13 hours earlier. A timestamp without a zone is read
as UTC. A timestamp that does not parse, or lies in the future, would otherwise win "the
latest" forever: it counts as the oldest (`recency`), and apply refuses the trace with
`timestamp_problem`'s reason.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

__all__ = [
    "FUTURE_SKEW",
    "NAIVE_SKEW",
    "OLDEST",
    "parse_timestamp",
    "recency",
    "timestamp_problem",
]

# Clocks of the machines that wrote a dataset are not this one's: a minute of skew is
# allowed. A timestamp without a zone may be local time anywhere (up to UTC+14).
FUTURE_SKEW = timedelta(minutes=1)
NAIVE_SKEW = timedelta(hours=14) + FUTURE_SKEW
# Where a timestamp that proves nothing sorts: before every real one.
OLDEST = datetime.min.replace(tzinfo=timezone.utc)


def parse_timestamp(timestamp: Any) -> datetime | None:
    """`timestamp` (ISO 8601) as a timezone-aware time (no zone: UTC); None if it is not one."""
    when = _fromisoformat(timestamp)
    if when is None:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _fromisoformat(timestamp: Any) -> datetime | None:
    if not isinstance(timestamp, str):
        return None
    if timestamp[-1:] in ("Z", "z"):  # Python 3.10 reads only "+00:00"
        timestamp = timestamp[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(timestamp)
    except ValueError:
        return None


def timestamp_problem(timestamp: Any, now: datetime) -> str | None:
    """Why `timestamp` proves nothing about when a trace was measured (it is not an ISO 8601
    time, or it lies in the future of `now` beyond the clock skew allowed), or None."""
    read = _fromisoformat(timestamp)
    if read is None:
        return f"timestamp {timestamp!r} is not an ISO 8601 time"
    naive = read.tzinfo is None
    when = read.replace(tzinfo=timezone.utc) if naive else read
    if when > now + (NAIVE_SKEW if naive else FUTURE_SKEW):
        return f"timestamp {timestamp} is in the future"
    return None


def recency(timestamp: Any, now: datetime | None = None) -> datetime:
    """The key "the latest trace" is chosen by: the parsed time, or OLDEST for a timestamp
    that does not parse or lies in the future (see `timestamp_problem`). Equal keys keep
    their order of record: callers let the later-recorded trace win a tie."""
    now = now if now is not None else datetime.now(timezone.utc)
    if timestamp_problem(timestamp, now) is not None:
        return OLDEST
    when = parse_timestamp(timestamp)
    assert when is not None
    return when
