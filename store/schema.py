"""The schema, one numbered step per version.

``MIGRATIONS[i]`` takes a file from ``PRAGMA user_version = i`` to ``i + 1``.
Steps are only ever appended: a released step never changes, so every file,
however old, reaches the same schema by replaying the steps it lacks.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "VERSION"]

# The statuses in CHECK constraints and partial indexes are spelled out: a
# released step never changes, whatever ``states`` becomes.

_JOBS = (
    # seq orders jobs by creation (AUTOINCREMENT: never reused, even after the
    # newest job is evicted), which breaks ties in eviction and orders restart.
    """
    CREATE TABLE jobs (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,
        id         TEXT    NOT NULL UNIQUE,
        owner      TEXT    NOT NULL,
        status     TEXT    NOT NULL CHECK (status IN
                   ('queued', 'running', 'done', 'failed', 'partial', 'cancelled')),
        created_at REAL    NOT NULL,
        updated_at REAL    NOT NULL,
        touched_at REAL    NOT NULL,
        nbytes     INTEGER NOT NULL DEFAULT 0 CHECK (nbytes >= 0)
    )
    """,
    # Eviction takes the least recently touched terminal job: this index hands
    # it over without a scan, and holds no live job at all.
    """
    CREATE INDEX jobs_evictable ON jobs (touched_at, seq)
    WHERE status IN ('done', 'failed', 'partial', 'cancelled')
    """,
    """
    CREATE TABLE targets (
        job_id TEXT    NOT NULL REFERENCES jobs (id),
        pos    INTEGER NOT NULL CHECK (pos >= 0),
        ref    TEXT    NOT NULL,
        status TEXT    NOT NULL DEFAULT 'pending'
               CHECK (status IN ('pending', 'done', 'failed')),
        result TEXT,
        error  TEXT,
        hint   TEXT,
        PRIMARY KEY (job_id, pos)
    ) WITHOUT ROWID
    """,
    # The byte total of every job, kept as targets are stored so that the
    # budget check after each target is one row read, not a SUM over targets.
    """
    CREATE TABLE job_bytes (
        one   INTEGER PRIMARY KEY CHECK (one = 1),
        total INTEGER NOT NULL CHECK (total >= 0)
    )
    """,
    "INSERT INTO job_bytes (one, total) VALUES (1, 0)",
)

_RUNS = (
    # caps: a JSON array of labels, sorted. A draining node finishes the run
    # it holds and takes no new one.
    """
    CREATE TABLE nodes (
        id        TEXT    PRIMARY KEY,
        name      TEXT    NOT NULL,
        caps      TEXT    NOT NULL,
        draining  INTEGER NOT NULL DEFAULT 0 CHECK (draining IN (0, 1)),
        last_seen REAL    NOT NULL
    )
    """,
    # runs.state is the queue: QUEUED rows in (created_at, id) order. There is
    # no queue table and no priority column.
    """
    CREATE TABLE runs (
        id         TEXT PRIMARY KEY,
        state      TEXT NOT NULL
                   CHECK (state IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED')),
        reason     TEXT,
        created_at REAL NOT NULL UNIQUE,
        started_at REAL,
        ended_at   REAL,
        warnings   TEXT NOT NULL DEFAULT '[]'
    )
    """,
    "CREATE INDEX runs_queued ON runs (created_at, id) WHERE state = 'QUEUED'",
    # node_id is '' until the run is placed: such a step matches no node.
    """
    CREATE TABLE steps (
        run_id  TEXT    NOT NULL REFERENCES runs (id),
        seq     INTEGER NOT NULL CHECK (seq >= 1),
        name    TEXT    NOT NULL,
        kind    TEXT    NOT NULL,
        needs   TEXT    NOT NULL,
        state   TEXT    NOT NULL DEFAULT 'PENDING'
                CHECK (state IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED')),
        node_id TEXT    NOT NULL DEFAULT '',
        output  TEXT,
        PRIMARY KEY (run_id, seq),
        UNIQUE (run_id, name)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX steps_node ON steps (node_id, state) WHERE node_id != ''",
    # One lease per node, by its primary key: the last line of defence against
    # a node placed twice, whatever the matcher says.
    """
    CREATE TABLE leases (
        node_id   TEXT PRIMARY KEY REFERENCES nodes (id),
        run_id    TEXT NOT NULL REFERENCES runs (id),
        not_after REAL NOT NULL
    )
    """,
    "CREATE INDEX leases_run ON leases (run_id)",
    "CREATE INDEX leases_expiry ON leases (not_after)",
    # The Record: opened at submit, filled at placement, sealed when the run
    # ends. steps: a JSON array of {seq, name, node_id, node_name, state}.
    """
    CREATE TABLE records (
        run_id    TEXT PRIMARY KEY REFERENCES runs (id),
        state     TEXT NOT NULL,
        reason    TEXT,
        opened_at REAL NOT NULL,
        sealed_at REAL,
        steps     TEXT NOT NULL,
        digest    TEXT,
        CHECK ((sealed_at IS NULL) = (digest IS NULL))
    )
    """,
    # A sealed Record never changes again, whoever writes to the file.
    """
    CREATE TRIGGER records_sealed_update BEFORE UPDATE ON records
    WHEN OLD.sealed_at IS NOT NULL
    BEGIN SELECT RAISE(ABORT, 'the record is sealed'); END
    """,
    """
    CREATE TRIGGER records_sealed_delete BEFORE DELETE ON records
    WHEN OLD.sealed_at IS NOT NULL
    BEGIN SELECT RAISE(ABORT, 'the record is sealed'); END
    """,
)

_RUNNERS = (
    # Each batch runner registers here and beats while it lives. A live job
    # belongs to the runner that accepted (or took over) it; a runner takes
    # over only the jobs of one that closed, stopped beating, or whose process
    # is gone.
    """
    CREATE TABLE runners (
        id           TEXT    PRIMARY KEY,
        host         TEXT    NOT NULL,
        pid          INTEGER NOT NULL,
        started_at   REAL    NOT NULL,
        heartbeat_at REAL    NOT NULL,
        closed       INTEGER NOT NULL DEFAULT 0 CHECK (closed IN (0, 1))
    )
    """,
    # NULL: accepted before runners registered; any runner may take it over.
    "ALTER TABLE jobs ADD COLUMN runner_id TEXT",
    """
    CREATE INDEX jobs_live ON jobs (runner_id, seq)
    WHERE status IN ('queued', 'running')
    """,
)

_LEASES = (
    # A live job is held by one runner at a time through a lease: its owner
    # (lease_owner, a runner id; NULL: no runner holds it, it waits for one
    # with room), until when (lease_until, the store's clock) and a fencing
    # token bumped whenever the job changes owner. Every write a runner makes
    # for a job names the owner and token it holds. runner_id stays the
    # runner the job was submitted through (its "home").
    "ALTER TABLE jobs ADD COLUMN lease_owner TEXT",
    "ALTER TABLE jobs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN lease_until REAL",
    # Jobs of an older library: leased to their runner, lapsed.
    """
    UPDATE jobs SET lease_owner = runner_id, lease_token = 1, lease_until = 0
    WHERE status IN ('queued', 'running') AND runner_id IS NOT NULL
    """,
    "CREATE INDEX jobs_leased ON jobs (lease_owner) WHERE lease_owner IS NOT NULL",
    # The lease length each runner beats with: it is gone once silent for
    # its own lapse, whatever the lapse of the runner looking.
    "ALTER TABLE runners ADD COLUMN lapse REAL NOT NULL DEFAULT 5.0",
    "CREATE INDEX jobs_waiting ON jobs (seq) WHERE status IN ('queued', 'running')",
    # When a runner last beat, by the store's clock: a beat that finds the
    # one before it long past knows the store could not be written meanwhile
    # (every runner was blocked), and gives that time back to every lease.
    """
    CREATE TABLE lease_clock (
        one     INTEGER PRIMARY KEY CHECK (one = 1),
        beat_at REAL    NOT NULL
    )
    """,
    "INSERT INTO lease_clock (one, beat_at) VALUES (1, 0)",
)

_NODE_CHANGES = (
    # Bumped whenever a node is advertised: a store keeps what the nodes
    # advertise in memory, and reads it again only once this moved.
    """
    CREATE TABLE node_generation (
        one        INTEGER PRIMARY KEY CHECK (one = 1),
        generation INTEGER NOT NULL
    )
    """,
    "INSERT INTO node_generation (one, generation) VALUES (1, 0)",
    # Draining nodes are few: counting those without a lease is then cheap.
    "CREATE INDEX nodes_draining ON nodes (id) WHERE draining = 1",
)

_JOB_COUNTS = (
    # A job's target counts, kept as its targets are stored (like nbytes),
    # so that listing jobs, or following a run's progress, reads one row per
    # job instead of counting every target.
    "ALTER TABLE jobs ADD COLUMN ntargets INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN ndone INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN nfailed INTEGER NOT NULL DEFAULT 0",
    """
    UPDATE jobs SET
        ntargets = (SELECT count(*) FROM targets t WHERE t.job_id = jobs.id),
        ndone = (SELECT count(*) FROM targets t WHERE t.job_id = jobs.id AND t.status = 'done'),
        nfailed = (SELECT count(*) FROM targets t WHERE t.job_id = jobs.id AND t.status = 'failed')
    """,
)

_JOB_NAMES = (
    # What the submitter called the job (a host, a file), for people reading
    # a listing; NULL when it gave none.
    "ALTER TABLE jobs ADD COLUMN name TEXT",
)

_QUEUE_CHANGES = (
    # Bumped whenever runs leave the queue (placed, or cancelled while
    # QUEUED): a store keeps the nodes that long-waiting runs reserve in
    # memory, and reads the queue again only once this moved.
    """
    CREATE TABLE queue_generation (
        one        INTEGER PRIMARY KEY CHECK (one = 1),
        generation BIGINT  NOT NULL
    )
    """,
    "INSERT INTO queue_generation (one, generation) VALUES (1, 0)",
)

_BYTE_SLOTS = (
    # The byte total in slots, each writer adding to its own (``jobs.SLOTS``)
    # and the total their sum: no single row that every commit updates, so
    # writers side by side (on PostgreSQL) never queue on one. A slot may go
    # below zero (an eviction in one frees bytes another slot added); the
    # sum never does.
    "CREATE TABLE job_bytes_slots (slot INTEGER PRIMARY KEY, total BIGINT NOT NULL)",
    "INSERT INTO job_bytes_slots (slot, total) SELECT 0, total FROM job_bytes",
    "DROP TABLE job_bytes",
    "ALTER TABLE job_bytes_slots RENAME TO job_bytes",
)

_UPSTREAMS = (
    # Each runner's share of an upstream's limits (``store.upstreams``): how
    # many of its jobs want it, the concurrency slots and the starts a second
    # it holds, and when it last said so (a row unseen for its ``lapse``
    # counts for nothing).
    """
    CREATE TABLE upstream_shares (
        upstream  TEXT    NOT NULL,
        runner_id TEXT    NOT NULL,
        demand    INTEGER NOT NULL CHECK (demand >= 0),
        slots     INTEGER NOT NULL CHECK (slots >= 0),
        rate      REAL    NOT NULL CHECK (rate >= 0),
        seen_at   REAL    NOT NULL,
        lapse     REAL    NOT NULL,
        PRIMARY KEY (upstream, runner_id)
    ) WITHOUT ROWID
    """,
    # Until when a busy answer holds an upstream, by the store's clock; the
    # row is also what a runner locks to change the upstream's shares.
    """
    CREATE TABLE upstream_holds (
        upstream   TEXT PRIMARY KEY,
        held_until REAL NOT NULL
    ) WITHOUT ROWID
    """,
)

_TARGET_STORED = """
    CREATE TRIGGER target_stored AFTER UPDATE OF status ON targets
    WHEN old.status = 'pending' AND new.status <> 'pending'
    BEGIN
        INSERT INTO events (kind, id, at, data) VALUES ('target.stored', new.job_id,
            store_now(), json_object('pos', new.pos, 'status', new.status));
    END
    """

_EVENTS = (
    # What happens on the store, in commit order (``store.events``): a row
    # per change, written by triggers in the transaction that makes the
    # change, whichever statement makes it. seq: the rowid, one past the
    # greatest, never reused because pruning never takes the newest
    # (AUTOINCREMENT would make sure of it by writing sqlite_sequence for
    # every event: it doubled the cost of storing a target).
    # ``store_now()`` is the transaction's time, a function each writing
    # connection defines.
    """
    CREATE TABLE events (
        seq  INTEGER PRIMARY KEY,
        kind TEXT    NOT NULL,
        id   TEXT    NOT NULL,
        at   REAL    NOT NULL,
        data TEXT    NOT NULL
    )
    """,
    # Every event at or below ``below`` was pruned: a watch from there has
    # lost some.
    """
    CREATE TABLE events_pruned (
        one   INTEGER PRIMARY KEY CHECK (one = 1),
        below INTEGER NOT NULL
    )
    """,
    "INSERT INTO events_pruned (one, below) VALUES (1, 0)",
    """
    CREATE TRIGGER job_submitted AFTER INSERT ON jobs BEGIN
        INSERT INTO events (kind, id, at, data) VALUES ('job.submitted', new.id, store_now(),
            json_object('owner', new.owner, 'name', new.name, 'targets', new.ntargets));
    END
    """,
    """
    CREATE TRIGGER job_moved AFTER UPDATE OF status ON jobs
    WHEN old.status IN ('queued', 'running') AND new.status IS NOT old.status
         AND new.status <> 'queued'
    BEGIN
        INSERT INTO events (kind, id, at, data) VALUES (
            CASE new.status WHEN 'running' THEN 'job.started' ELSE 'job.ended' END,
            new.id, store_now(), json_object('owner', new.owner, 'status', new.status));
    END
    """,
    _TARGET_STORED,
    """
    CREATE TRIGGER run_submitted AFTER INSERT ON runs BEGIN
        INSERT INTO events (kind, id, at, data) VALUES (
            CASE new.state WHEN 'QUEUED' THEN 'run.queued' ELSE 'run.started' END,
            new.id, store_now(), json_object('state', new.state));
    END
    """,
    """
    CREATE TRIGGER run_moved AFTER UPDATE OF state ON runs
    WHEN new.state IS NOT old.state
    BEGIN
        INSERT INTO events (kind, id, at, data) VALUES (
            CASE new.state WHEN 'RUNNING' THEN 'run.started' ELSE 'run.ended' END,
            new.id, store_now(), json_object('state', new.state, 'reason', new.reason));
    END
    """,
)

_JOB_COUNTS_BY_STATUS = (
    # How many jobs are in each status, kept by triggers as jobs are
    # submitted, move and are evicted, so that a scrape of the store's
    # gauges reads a few rows, not a count over every job. In slots, as the
    # byte total is: SQLite uses one; PostgreSQL's writers each their own
    # (``store.postgres``), so that none waits on another's row. A slot may
    # go below zero; the sum of a status never does.
    """
    CREATE TABLE job_counts (
        slot   INTEGER NOT NULL,
        status TEXT    NOT NULL,
        n      INTEGER NOT NULL,
        PRIMARY KEY (slot, status)
    ) WITHOUT ROWID
    """,
    "INSERT INTO job_counts (slot, status, n) SELECT 0, status, count(*) FROM jobs GROUP BY status",
    """
    CREATE TRIGGER job_counted AFTER INSERT ON jobs BEGIN
        INSERT INTO job_counts (slot, status, n) VALUES (0, new.status, 1)
            ON CONFLICT (slot, status) DO UPDATE SET n = n + 1;
    END
    """,
    """
    CREATE TRIGGER job_recounted AFTER UPDATE OF status ON jobs
    WHEN new.status IS NOT old.status
    BEGIN
        UPDATE job_counts SET n = n - 1 WHERE slot = 0 AND status = old.status;
        INSERT INTO job_counts (slot, status, n) VALUES (0, new.status, 1)
            ON CONFLICT (slot, status) DO UPDATE SET n = n + 1;
    END
    """,
    """
    CREATE TRIGGER job_uncounted AFTER DELETE ON jobs BEGIN
        UPDATE job_counts SET n = n - 1 WHERE slot = 0 AND status = old.status;
    END
    """,
)

_JOB_TRACES = (
    # The trace context current at submit (a W3C traceparent), so that a
    # runner in any process continues the submitter's trace.
    "ALTER TABLE jobs ADD COLUMN trace TEXT",
)

_JOB_KEYS = (
    # The submitter's idempotency key: one job per owner and key, whoever
    # submits it (a unique index, so two submits racing in any processes
    # make one job). Free again once the job is evicted or pruned.
    "ALTER TABLE jobs ADD COLUMN idempotency_key TEXT",
    """
    CREATE UNIQUE INDEX jobs_keyed ON jobs (owner, idempotency_key)
    WHERE idempotency_key IS NOT NULL
    """,
)

_PAUSES = (
    # What an operator paused (``store.pauses``): no new target starts for
    # that caller, or of that upstream, on any runner of the store.
    """
    CREATE TABLE paused (
        kind  TEXT NOT NULL CHECK (kind IN ('caller', 'upstream')),
        name  TEXT NOT NULL,
        since REAL NOT NULL,
        PRIMARY KEY (kind, name)
    )
    """,
)

_JOBS_ENDED = (
    # Retention by status and age (``Store.prune``): the jobs of a status
    # that ended longest ago first, without a scan; no live job in it.
    """
    CREATE INDEX jobs_ended ON jobs (status, updated_at)
    WHERE status IN ('done', 'failed', 'partial', 'cancelled')
    """,
)

_LATER = (
    # A job that starts later (``submit(not_before=..., after=[...])``) is
    # stored deferred: no runner takes it until its time came (not_before,
    # by the store's clock; 0 for none) and every job it waits after ended
    # (waits: how many have not; a trigger counts them down). With
    # after_ok, it runs only if they all ended done; else it ends
    # cancelled, its reason said.
    "ALTER TABLE jobs ADD COLUMN deferred INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN not_before REAL",
    "ALTER TABLE jobs ADD COLUMN waits INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN after_ok INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN reason TEXT",
    """
    CREATE TABLE job_after (
        job_id   TEXT NOT NULL,
        after_id TEXT NOT NULL,
        PRIMARY KEY (job_id, after_id)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX job_after_by ON job_after (after_id)",
    # The deferred jobs free to go, soonest first.
    "CREATE INDEX jobs_due ON jobs (not_before) WHERE deferred = 1 AND waits = 0",
    # What runners take leaves deferred jobs out, however many wait.
    "DROP INDEX jobs_live",
    """
    CREATE INDEX jobs_live ON jobs (runner_id, seq)
    WHERE status IN ('queued', 'running') AND deferred = 0
    """,
    "DROP INDEX jobs_waiting",
    """
    CREATE INDEX jobs_waiting ON jobs (seq)
    WHERE status IN ('queued', 'running') AND deferred = 0
    """,
    """
    CREATE TRIGGER job_after_ended AFTER UPDATE OF status ON jobs
    WHEN old.status IN ('queued', 'running') AND new.status NOT IN ('queued', 'running')
    BEGIN
        UPDATE jobs SET waits = waits - 1
         WHERE id IN (SELECT job_id FROM job_after WHERE after_id = new.id);
    END
    """,
)

_ENDED = "(status = 'done' OR status = 'failed' OR status = 'partial' OR status = 'cancelled')"

_CHAINED_TESTS = (
    # The conditions SQLite tests for each row written, spelled as chains
    # of ``=`` (``states.sql_one_of``), not ``IN`` lists of three or more:
    # SQLite builds such a list's lookup table each time a statement runs,
    # every row of an ``executemany``, and storing a target paid 3 us for
    # each (13 of its 30 us): the targets' status check, and the partial
    # indexes of ended jobs, whose entries change with a job's
    # ``updated_at``. A check can only change with its table: targets is
    # copied into a new one (a store of many targets takes a while to open
    # once, at this step).
    "DROP INDEX jobs_evictable",
    f"CREATE INDEX jobs_evictable ON jobs (touched_at, seq) WHERE {_ENDED}",
    "DROP INDEX jobs_ended",
    f"CREATE INDEX jobs_ended ON jobs (status, updated_at) WHERE {_ENDED}",
    """
    CREATE TABLE targets_chained (
        job_id TEXT    NOT NULL REFERENCES jobs (id),
        pos    INTEGER NOT NULL CHECK (pos >= 0),
        ref    TEXT    NOT NULL,
        status TEXT    NOT NULL DEFAULT 'pending'
               CHECK (status = 'pending' OR status = 'done' OR status = 'failed'),
        result TEXT,
        error  TEXT,
        hint   TEXT,
        PRIMARY KEY (job_id, pos)
    ) WITHOUT ROWID
    """,
    "INSERT INTO targets_chained (job_id, pos, ref, status, result, error, hint)"
    " SELECT job_id, pos, ref, status, result, error, hint FROM targets",
    "DROP TABLE targets",
    "ALTER TABLE targets_chained RENAME TO targets",
    _TARGET_STORED,
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    _JOBS,
    _RUNS,
    _RUNNERS,
    _LEASES,
    _NODE_CHANGES,
    _JOB_COUNTS,
    _JOB_NAMES,
    _QUEUE_CHANGES,
    _BYTE_SLOTS,
    _UPSTREAMS,
    _EVENTS,
    _JOB_COUNTS_BY_STATUS,
    _JOB_TRACES,
    _JOB_KEYS,
    _PAUSES,
    _JOBS_ENDED,
    _LATER,
    _CHAINED_TESTS,
    # New jobs stored by one server function on PostgreSQL; nothing here.
    (),
)
VERSION = len(MIGRATIONS)
