"""Steps 12 on of the store's schema (``store.schema``), each its SQLite
text then its PostgreSQL text. Written as they were released: never
edited, only followed by new steps, appended to ``STEPS`` here until this
module grows long (then a new module, added to ``HISTORY``)."""

from __future__ import annotations

from .step import Step
from .steps_09 import TARGET_STORED

__all__ = ["STEPS"]

# -- step 12: jobs counted by status ------------------------------------------------

_JOB_COUNTS_BY_STATUS = (
    # How many jobs are in each status, kept by triggers as jobs are
    # submitted, move and are evicted, so that a scrape of the store's
    # gauges reads a few rows, not a count over every job. In slots, as the
    # byte total is: SQLite uses one; PostgreSQL's writers each their own
    # (``store.engines.postgres``), so that none waits on another's row. A slot may
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

# Each writer counts in the slot of its session (its backend's pid, of 64):
# writers side by side seldom touch one row.
_JOB_COUNTS_BY_STATUS_PG = (
    """
    CREATE TABLE job_counts (
        slot   INTEGER NOT NULL,
        status TEXT    NOT NULL,
        n      BIGINT  NOT NULL,
        PRIMARY KEY (slot, status)
    )
    """,
    "INSERT INTO job_counts (slot, status, n) SELECT 0, status, count(*) FROM jobs GROUP BY status",
    """
    CREATE FUNCTION store_jobs_counted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO job_counts (slot, status, n)
        SELECT pg_backend_pid() % 64, status, count(*) FROM fresh GROUP BY status ORDER BY status
            ON CONFLICT (slot, status) DO UPDATE SET n = job_counts.n + excluded.n;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER jobs_counted AFTER INSERT ON jobs REFERENCING NEW TABLE AS fresh
    FOR EACH STATEMENT EXECUTE FUNCTION store_jobs_counted()
    """,
    """
    CREATE FUNCTION store_job_recounted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO job_counts (slot, status, n)
        SELECT pg_backend_pid() % 64, d.status, d.n
          FROM (VALUES (OLD.status, -1), (NEW.status, 1)) AS d (status, n)
         WHERE d.status IS NOT NULL
         ORDER BY d.status
            ON CONFLICT (slot, status) DO UPDATE SET n = job_counts.n + excluded.n;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER job_recounted AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status) EXECUTE FUNCTION store_job_recounted()
    """,
    """
    CREATE TRIGGER job_uncounted AFTER DELETE ON jobs FOR EACH ROW
    EXECUTE FUNCTION store_job_recounted()
    """,
)

# -- step 13: a job's trace context -------------------------------------------------

_JOB_TRACES = (
    # The trace context current at submit (a W3C traceparent), so that a
    # runner in any process continues the submitter's trace.
    "ALTER TABLE jobs ADD COLUMN trace TEXT",
)
_JOB_TRACES_PG = _JOB_TRACES

# -- step 14: idempotency keys ------------------------------------------------------

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
_JOB_KEYS_PG = _JOB_KEYS

# -- step 15: pauses ----------------------------------------------------------------

_PAUSES = (
    # What an operator paused (``store.jobs.pauses``): no new target starts for
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

_PAUSES_PG = (
    """
        CREATE TABLE paused (
            kind  TEXT NOT NULL CHECK (kind IN ('caller', 'upstream')),
            name  TEXT COLLATE "C" NOT NULL,
            since DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (kind, name)
        )
        """,
)

# -- step 16: retention's index -----------------------------------------------------

_JOBS_ENDED = (
    # Retention by status and age (``Store.prune``): the jobs of a status
    # that ended longest ago first, without a scan; no live job in it.
    """
    CREATE INDEX jobs_ended ON jobs (status, updated_at)
    WHERE status IN ('done', 'failed', 'partial', 'cancelled')
    """,
)
_JOBS_ENDED_PG = _JOBS_ENDED

# -- step 17: jobs that start later -------------------------------------------------

# The indexes of jobs that start later, the same on both engines.
_LATER_INDEXES = (
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
    *_LATER_INDEXES,
    """
    CREATE TRIGGER job_after_ended AFTER UPDATE OF status ON jobs
    WHEN old.status IN ('queued', 'running') AND new.status NOT IN ('queued', 'running')
    BEGIN
        UPDATE jobs SET waits = waits - 1
         WHERE id IN (SELECT job_id FROM job_after WHERE after_id = new.id);
    END
    """,
)

_LATER_PG = (
    "ALTER TABLE jobs ADD COLUMN deferred INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN not_before DOUBLE PRECISION",
    "ALTER TABLE jobs ADD COLUMN waits INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN after_ok INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN reason TEXT",
    """
        CREATE TABLE job_after (
            job_id   TEXT COLLATE "C" NOT NULL,
            after_id TEXT COLLATE "C" NOT NULL,
            PRIMARY KEY (job_id, after_id)
        )
        """,
    *_LATER_INDEXES,
    """
        CREATE FUNCTION store_job_after_ended() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            freed BOOLEAN;
        BEGIN
            WITH counted AS (
                UPDATE jobs SET waits = waits - 1
                 WHERE id IN (SELECT job_id FROM job_after WHERE after_id = NEW.id)
                RETURNING waits
            )
            SELECT bool_or(waits = 0) INTO freed FROM counted;
            IF freed THEN
                PERFORM pg_notify('batch_store', 'work');
            END IF;
            RETURN NULL;
        END $$
        """,
    """
        CREATE TRIGGER job_after_ended AFTER UPDATE OF status ON jobs FOR EACH ROW
        WHEN (OLD.status IN ('queued', 'running') AND NEW.status NOT IN ('queued', 'running'))
        EXECUTE FUNCTION store_job_after_ended()
        """,
)

# -- step 18: SQLite's per-row tests as chains of = ---------------------------------

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
    TARGET_STORED,
)

# PostgreSQL tests an IN list as cheaply, and proves a query's chain
# implies the ``IN`` of its partial indexes: nothing changes.
_CHAINED_TESTS_PG = ()

# -- step 19: PostgreSQL: new jobs stored by one function ---------------------------

_CREATE_FUNCTION = ()  # nothing on SQLite

_CREATE_FUNCTION_PG = (
    # New jobs stored by one call (``jobs.create_jobs``), the transaction's
    # one statement: one round trip with its BEGIN and COMMIT, where the
    # same work statement by statement took three. What SQLite's path does,
    # in the same order: the jobs to wait after locked and counted (the
    # first missing one answered, and nothing stored); the keys locked in
    # one order (see ``postgres.KEYS_LOCK``); the jobs inserted (the first
    # ``held`` leased to ``runner`` until ``at + lease_for``), a job whose
    # key is taken left out; each job's id in the store read back, in a
    # statement of its own so that a key another transaction committed
    # meanwhile is seen; the targets and the waits of the jobs made;
    # ``work`` told the runners.
    """
CREATE FUNCTION store_create_jobs(
    j_owner TEXT, j_new JSON, j_runner TEXT, j_lease_for DOUBLE PRECISION, j_held INTEGER,
    j_deferred BOOLEAN, j_not_before DOUBLE PRECISION, j_after TEXT[], j_after_ok BOOLEAN,
    j_work BOOLEAN, at DOUBLE PRECISION, OUT ids TEXT[], OUT missing TEXT
) LANGUAGE plpgsql
  -- Planned once per session, as ``store_record`` is (see there).
  SET plan_cache_mode = force_generic_plan
  SET jit = off
AS $$
DECLARE
    j_waits INTEGER := 0;
BEGIN
    IF cardinality(j_after) > 0 THEN
        PERFORM 1 FROM jobs WHERE owner = j_owner AND id = ANY (j_after) ORDER BY id FOR UPDATE;
        SELECT a.id INTO missing FROM unnest(j_after) WITH ORDINALITY AS a (id, k)
         WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE owner = j_owner AND jobs.id = a.id)
         ORDER BY a.k LIMIT 1;
        IF missing IS NOT NULL THEN
            RETURN;
        END IF;
        SELECT count(*) INTO j_waits FROM unnest(j_after) AS a (id)
          JOIN jobs ON jobs.owner = j_owner AND jobs.id = a.id
         WHERE jobs.status IN ('queued', 'running');
    END IF;
    PERFORM count(pg_advisory_xact_lock(7038329, h)) FROM (
        SELECT DISTINCT hashtext(j_owner || chr(31) || (j ->> 'key')) AS h
          FROM json_array_elements(j_new) AS j WHERE j ->> 'key' IS NOT NULL ORDER BY h
    ) AS keys;
    INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at, runner_id,
                      lease_owner, lease_token, lease_until, ntargets, name, trace,
                      idempotency_key, deferred, not_before, waits, after_ok)
    SELECT j ->> 'id', j_owner, 'queued', at, at, at, j_runner,
           CASE WHEN k <= j_held THEN j_runner END, CASE WHEN k <= j_held THEN 1 ELSE 0 END,
           CASE WHEN k <= j_held THEN at + j_lease_for END,
           json_array_length(j -> 'refs'), j ->> 'name', j ->> 'trace', j ->> 'key',
           j_deferred::int, j_not_before, j_waits, j_after_ok::int
      FROM json_array_elements(j_new) WITH ORDINALITY AS new (j, k) ORDER BY k
        ON CONFLICT (owner, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
    SELECT array_agg(coalesce(
               (SELECT id FROM jobs WHERE owner = j_owner AND idempotency_key = j ->> 'key'),
               j ->> 'id') ORDER BY k)
      INTO ids FROM json_array_elements(j_new) WITH ORDINALITY AS new (j, k);
    -- Each job's fields read once: a field read per target would parse
    -- the job's whole text again (20,000 targets took 20 s).
    WITH made AS MATERIALIZED (
        SELECT j ->> 'id' AS id, j -> 'refs' AS refs
          FROM json_array_elements(j_new) WITH ORDINALITY AS new (j, k)
         WHERE ids[k] = j ->> 'id'
    )
    INSERT INTO targets (job_id, pos, ref)
    SELECT made.id, pos - 1, ref
      FROM made, json_array_elements_text(made.refs) WITH ORDINALITY AS refs (ref, pos);
    INSERT INTO job_after (job_id, after_id)
    SELECT j ->> 'id', a FROM json_array_elements(j_new) WITH ORDINALITY AS new (j, k),
           unnest(j_after) AS a
     WHERE ids[k] = j ->> 'id';
    IF j_work THEN
        PERFORM pg_notify('batch_store', 'work');
    END IF;
END $$
""",
)

STEPS = (
    Step(_JOB_COUNTS_BY_STATUS, _JOB_COUNTS_BY_STATUS_PG),
    Step(_JOB_TRACES, _JOB_TRACES_PG),
    Step(_JOB_KEYS, _JOB_KEYS_PG),
    Step(_PAUSES, _PAUSES_PG),
    Step(_JOBS_ENDED, _JOBS_ENDED_PG),
    Step(_LATER, _LATER_PG),
    Step(_CHAINED_TESTS, _CHAINED_TESTS_PG),
    Step(_CREATE_FUNCTION, _CREATE_FUNCTION_PG),
)
