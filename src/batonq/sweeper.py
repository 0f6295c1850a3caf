"""The sweeper: expires leases in queues nobody is claiming from, fires
cron schedules, keeps the archive's partitions and retention, and vacuums
and analyzes the hot table's partitions as their dead row versions and
changes pile up. Any process may run one; a lease in the database
(``batonq.lead``) elects a single leader, and the others stand by to take
over. The lease is a row, not a session lock: a sweeper keeps no session
state, so it runs through a transaction pooler as well as straight to
PostgreSQL."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime
from typing import Any

import psycopg

from batonq import schedules

__all__ = ["APPLICATION_NAME", "Sweeper"]

log = logging.getLogger("batonq.sweeper")
APPLICATION_NAME = "batonq sweeper"
_LEADER = "sweeper"
# Vacuuming is a duty apart, held by one process among those whose role may
# vacuum the hot table: the leader is often a worker's sweeper, whose role
# owns no table.
_VACUUM = "vacuum"
_MAY_VACUUM = "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = 'batonq.tasks'::regclass"

# The hot partitions with at least %s dead row versions that this role may
# vacuum (it owns them, or is a superuser): VACUUM cannot run in a function.
# Read every tick, so it asks the statistics for the hot table's partitions
# alone (pg_stat_user_tables builds a row for every table of the database,
# the archive's partitions included), and for the group lease deltas, which
# every grouped claim and complete adds and the claims delete.
_VACUUM_DUE = """
SELECT format('%%I.%%I', n.nspname, c.relname)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE (c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'batonq.tasks'::regclass)
        OR c.oid = 'batonq.group_lease_deltas'::regclass)
   AND pg_stat_get_dead_tuples(c.oid) >= %s
   AND pg_has_role(c.relowner, 'USAGE')
"""

# The hot partitions changed by at least %s rows since they were last
# analyzed (or ever, when never), that this role may analyze. The engine's
# hot statements read their batch without statistics; listings and the
# operator's reads plan better with them, and autovacuum may be off or not
# have run yet after a bulk load.
_ANALYZE_DUE = """
SELECT format('%%I.%%I', n.nspname, c.relname)
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE i.inhparent = 'batonq.tasks'::regclass
   AND pg_stat_get_mod_since_analyze(c.oid) >= %s
   AND pg_has_role(c.relowner, 'USAGE')
"""


_DUE_PAGE = 1000  # due schedules fired in one call
# Binary parameters: a text array of ten thousand times takes psycopg longer
# to write than the database to fire them.
_FIRE = (
    "SELECT batonq.fire_schedules(%b::text[], %b::timestamptz[], %b::timestamptz[], %b::timestamptz[],"
    " %b::timestamptz[], %b::integer[], %b::timestamptz[])"
)


def _fire(conn: psycopg.Connection, fires: list[tuple[str, Any, Any, schedules.FirePlan]]) -> int:
    """Fire the planned ticks of ``(name, armed_at, next_tick, plan)`` in
    one statement; the number of tasks enqueued."""
    if not fires:
        return 0
    tick_of = [i for i, (*_, fire) in enumerate(fires, 1) for _ in fire.ticks]
    row = conn.execute(
        _FIRE,
        (
            [name for name, *_ in fires],
            [armed_at for _, armed_at, _, _ in fires],
            [next_tick for _, _, next_tick, _ in fires],
            [fire.missed for *_, fire in fires],
            [fire.next_tick for *_, fire in fires],
            tick_of,
            [tick for *_, fire in fires for tick in fire.ticks],
        ),
    ).fetchone()
    return int(row[0]) if row else 0


def _log_warning(notice: psycopg.errors.Diagnostic) -> None:
    """The engine's warnings (a schedule's skipped tick) in the sweeper's log."""
    if notice.severity_nonlocalized == "WARNING":
        log.warning("%s", notice.message_primary)


class Sweeper:
    """Runs ``batonq.sweep()`` and fires the schedules' due ticks about every
    ``interval_s`` seconds and ``batonq.maintain()`` every
    ``maintain_every_s``, while leader; and, every ``interval_s``,
    VACUUMs each partition of the hot table that holds ``vacuum_dead`` dead
    row versions or more (0: never), and ANALYZEs each one changed by
    ``analyze_changed`` rows or more since it was last analyzed (0: never),
    when its role owns the tables and no other such sweeper does it (a lock
    of its own: the leader may be a sweeper whose role owns nothing).

    Every claim moves a row out of the claim index and every complete
    deletes one, so a busy queue leaves about two dead row versions per
    task; the claim reads past those at the head of its index until a vacuum
    removes them. Autovacuum at PostgreSQL's defaults looks at a database
    once a minute, long enough for a busy queue to slow by a quarter.

    Each duty is held under a lease of ``lease_s`` (default: five
    intervals, at least 1 s), renewed every interval: a sweeper that stops
    gives its duties up at once; one that dies (or loses the database) is
    replaced within ``lease_s`` and an interval. Each change of hands draws
    the duty's next fencing token (``token``; ``batonq.leaders`` shows who
    leads since when). A leader stalled past its lease (its process paused)
    may finish the statement it was in beside the new leader, which costs
    no correctness (claims expire leases beside the sweep all the time, and
    a tick fires once, by compare-and-set); at its next renewal it finds
    that it no longer leads.

    A schedule's tick fires within about ``interval_s`` of its time (every
    schedule due fires in the round, however many); one more than
    ``schedule_grace_s`` late when the round began (default: twice the
    interval, at least 2 s, plus ``lease_s``, the time a standby may take
    to take over) passed while no sweeper ran, and the schedule's missed-tick
    setting decides whether it fires."""

    def __init__(
        self,
        dsn: str,
        *,
        interval_s: float = 1.0,
        maintain_every_s: float = 60.0,
        vacuum_dead: int = 20_000,
        analyze_changed: int = 50_000,
        schedule_grace_s: float | None = None,
        lease_s: float | None = None,
    ) -> None:
        self._dsn = dsn
        self.interval_s = interval_s
        self.maintain_every_s = maintain_every_s
        self.vacuum_dead = vacuum_dead
        self.analyze_changed = analyze_changed
        self.lease_s = max(1.0, 5 * interval_s) if lease_s is None else lease_s
        if schedule_grace_s is None:
            schedule_grace_s = max(2.0, 2 * interval_s) + self.lease_s
        self.schedule_grace_s = schedule_grace_s
        # Unique per sweeper: two in one process are two candidates.
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.token: int | None = None  # the leader's term, while it leads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection | None = None
        self.is_leader = False
        self.vacuums_here = False  # holds the vacuum duty
        self.swept = 0
        self.vacuums = 0
        self.analyzes = 0
        self.fired = 0
        self._unreadable: set[str] = set()  # schedules warned of as unreadable

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="batonq-sweeper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        # A sweep, maintenance or VACUUM may run for long on a big table:
        # cancel it rather than wait for it (a worker's second signal must
        # stop it at once).
        conn = self._conn
        if conn is not None:
            conn.cancel_safe(timeout=2.0)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # Named, so an operator finds the sweepers in pg_stat_activity.
                # Never a prepared statement: through a transaction pooler the
                # next statement may reach another server session.
                with psycopg.connect(self._dsn, autocommit=True, prepare_threshold=None,
                                     application_name=APPLICATION_NAME) as conn:  # fmt: skip
                    conn.add_notice_handler(_log_warning)
                    self._conn = conn
                    try:
                        self._lead(conn)
                    finally:
                        self._conn = None
                        self._resign(conn)
            except psycopg.Error as error:
                if self._stop.is_set():
                    return  # the statement stop() cancelled
                log.warning("sweeper connection lost (%s); retrying", error)
                self._stop.wait(self.interval_s)

    def _lead(self, conn: psycopg.Connection) -> None:
        next_maintain = 0.0
        maintains = self.vacuum_dead > 0 or self.analyze_changed > 0
        row = conn.execute(_MAY_VACUUM).fetchone() if maintains else None
        may_vacuum = bool(row and row[0])
        while not self._stop.is_set():
            leader = self.is_leader
            self.token = self._take(conn, _LEADER)
            self.is_leader = self.token is not None
            if self.is_leader != leader:
                log.info("sweeper %s (term %s)", "leads" if self.is_leader else "no longer leads", self.token)
            if self.is_leader:
                row = conn.execute("SELECT batonq.sweep()").fetchone()
                self.swept += int(row[0]) if row else 0
                self._fire_schedules(conn)
                if time.monotonic() >= next_maintain:
                    row = conn.execute("SELECT batonq.maintain()").fetchone()
                    report = row[0] if row else {}
                    # Retention behind (a full batch removed): go on at the next
                    # tick, or a busy queue's finished tasks outgrow it.
                    behind = bool(report.get("behind"))
                    next_maintain = time.monotonic() + (self.interval_s if behind else self.maintain_every_s)
            if may_vacuum:
                self.vacuums_here = self._take(conn, _VACUUM) is not None
            # Every tick: a busy queue leaves two dead rows a task, and a
            # minute of them is hundreds of thousands for its claims to pass.
            if self.vacuums_here:
                self._vacuum(conn)
            self._stop.wait(self.interval_s)

    def _take(self, conn: psycopg.Connection, duty: str) -> int | None:
        """Renew or take ``duty``'s lease: its fencing token, None while
        another sweeper holds it."""
        row = conn.execute("SELECT batonq.lead(%s, %s, %s)", (duty, self.holder, self.lease_s)).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def _resign(self, conn: psycopg.Connection) -> None:
        """Give the duties up (on stop(); after a lost connection the
        leases run out instead)."""
        held = [duty for duty, mine in ((_LEADER, self.is_leader), (_VACUUM, self.vacuums_here)) if mine]
        self.is_leader = self.vacuums_here = False
        self.token = None
        for duty in held:
            for _ in range(2):  # stop()'s cancel may land on the first try
                try:
                    conn.execute("SELECT batonq.resign(%s, %s)", (duty, self.holder))
                    break
                except psycopg.errors.QueryCanceled:
                    continue
                except psycopg.Error:
                    return

    def _fire_schedules(self, conn: psycopg.Connection) -> None:
        """Every due schedule, a page at a time, each page fired in one call."""
        after = started = None
        while True:
            due = conn.execute("SELECT * FROM batonq.due_schedules(%s, %s)", (_DUE_PAGE, after)).fetchall()
            if due:
                started = started or due[0][-1]
                self._fire_page(conn, due, started)
            if len(due) < _DUE_PAGE or self._stop.is_set():
                return
            after = due[-1][0]

    def _fire_page(self, conn: psycopg.Connection, due: list[tuple[Any, ...]], started: datetime) -> None:
        """Fire a page of due schedules. A tick on time when the round
        ``started`` stays on time however long the round's earlier pages took
        (thousands due at once): missed ticks are those no firer was there for."""
        fires: list[tuple[str, Any, Any, schedules.FirePlan]] = []
        for name, cron, tz, armed_at, next_tick, now in due:
            grace_s = self.schedule_grace_s + (now - started).total_seconds()
            try:
                fire = schedules.plan(
                    cron, tz, armed_at=armed_at, next_tick=next_tick, now=now, grace_s=grace_s
                )
            except (ValueError, KeyError, LookupError) as error:  # written past the client's check
                if name not in self._unreadable:
                    self._unreadable.add(name)
                    log.warning("schedule %s cannot be read (%s); skipped", name, error)
                continue
            fires.append((name, armed_at, next_tick, fire))
        try:
            self.fired += _fire(conn, fires)
        except psycopg.OperationalError:
            raise  # the connection: the sweeper connects again
        except psycopg.Error:
            # One schedule's failure is its own: the others fire, and the
            # sweep and maintenance go on.
            for one in fires:
                try:
                    self.fired += _fire(conn, [one])
                except psycopg.OperationalError:
                    raise
                except psycopg.Error as error:
                    log.warning("schedule %s did not fire (%s)", one[0], error)

    def _vacuum(self, conn: psycopg.Connection) -> None:
        if self.vacuum_dead > 0:
            for (table,) in conn.execute(_VACUUM_DUE, (self.vacuum_dead,)).fetchall():
                # SKIP_LOCKED: a partition some DDL holds is left for the next round.
                conn.execute(f"VACUUM (SKIP_LOCKED) {table}")
                self.vacuums += 1
        if self.analyze_changed > 0:
            for (table,) in conn.execute(_ANALYZE_DUE, (self.analyze_changed,)).fetchall():
                conn.execute(f"ANALYZE (SKIP_LOCKED) {table}")
                self.analyzes += 1
