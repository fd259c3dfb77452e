"""Steps 9 to 11 of the store's schema (``store.schema``), each its
SQLite text then its PostgreSQL text. Written as they were released:
never edited, only followed by new steps."""

from __future__ import annotations

from .step import Step

__all__ = ["STEPS", "TARGET_STORED"]

# -- step 9: the byte total in slots; PostgreSQL: a batch stored, a run queued, in one call

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

_BYTE_SLOTS_PG = (
    "CREATE TABLE job_bytes_slots (slot INTEGER PRIMARY KEY, total BIGINT NOT NULL)",
    "INSERT INTO job_bytes_slots (slot, total) SELECT 0, total FROM job_bytes",
    "DROP TABLE job_bytes",
    "ALTER TABLE job_bytes_slots RENAME TO job_bytes",
    # ``store.jobs.outcomes.record`` on the server, taking the batch as JSON (an
    # array of outcomes, an array of starting jobs; see
    # ``outcomes.record_on_server``). Two statements: the first locks the
    # jobs, the second decides every verdict and makes every write (each of
    # its parts sees the jobs as locked: a new snapshot, READ COMMITTED);
    # then the byte total, and eviction if asked. Returns each outcome's
    # verdict and its job's status as decided, and the ids evicted.
    """
CREATE FUNCTION store_record(
    batch JSON, starting JSON,
    max_bytes BIGINT, evict_lock BIGINT, my_slot INTEGER, at DOUBLE PRECISION,
    OUT verdicts TEXT[], OUT seen TEXT[], OUT evicted TEXT[]
) LANGUAGE plpgsql
  -- Each statement planned once per session: planning it anew for each
  -- batch (the default, while a custom plan seems cheaper) cost more than
  -- running it. Every statement reaches its rows by key from the batch's
  -- few, so no plan scans a table or joins one whole: one made while a
  -- table was small would go on scanning it once large (a batch of 4
  -- outcomes took 5 ms scanning 20,000 targets; a merge join read the
  -- targets of every job in order). (The one scan left, of the byte
  -- slots, then looks costly enough to compile: no compiling, which cost
  -- 60 ms a batch.)
  SET plan_cache_mode = force_generic_plan
  SET enable_seqscan = off
  SET enable_mergejoin = off
  SET enable_hashjoin = off
  SET jit = off
AS $$
DECLARE
    added BIGINT;
    total BIGINT;
    kept  BIGINT;
    gone  RECORD;
BEGIN
    -- The jobs decided on, locked in id order.
    PERFORM 1 FROM jobs
      WHERE id = ANY (ARRAY(SELECT o.job FROM json_to_recordset(batch) AS o (job TEXT)
                            UNION ALL
                            SELECT s.job FROM json_to_recordset(starting) AS s (job TEXT)))
      ORDER BY id FOR UPDATE;

    WITH o AS (
        SELECT * FROM ROWS FROM (json_to_recordset(batch) AS (
                   job TEXT, pos INTEGER, status TEXT, result TEXT, error TEXT, hint TEXT,
                   nbytes BIGINT, job_end TEXT, owner TEXT, token BIGINT))
             WITH ORDINALITY
             AS o (job, pos, status, result, error, hint, nbytes, job_end, owner, token, ord)
    ), seen AS (
        SELECT o.*, j.status AS job_status, t.status AS target,
               coalesce(o.owner IS NULL
                   OR (j.lease_owner = o.owner AND j.lease_token = o.token)
                   OR (j.lease_owner IS NULL AND j.lease_token = o.token
                       AND j.status NOT IN ('queued', 'running')), false) AS holds
          FROM o
          LEFT JOIN jobs j ON j.id = o.job
          LEFT JOIN targets t ON t.job_id = o.job AND t.pos = o.pos
    ), c AS (
        SELECT seen.*,
               CASE WHEN job_status IS NULL THEN 'gone'
                    WHEN NOT holds THEN 'lease'
                    WHEN target IS DISTINCT FROM 'pending' THEN 'stored'
                    -- The first of two for one target wins.
                    WHEN row_number() OVER (PARTITION BY job, pos, holds, target
                                            ORDER BY ord) > 1 THEN 'stored'
                    ELSE 'ok' END AS verdict
          FROM seen
    ), stored AS (
        UPDATE targets t
           SET status = c.status, result = c.result, error = c.error, hint = c.hint
          FROM c
         WHERE c.verdict = 'ok' AND t.job_id = c.job AND t.pos = c.pos
    ), changes AS (
        SELECT job, sum(nbytes) AS nbytes,
               count(*) FILTER (WHERE status = 'done') AS ndone,
               count(*) FILTER (WHERE status = 'failed') AS nfailed,
               bool_or(owner IS NOT NULL) AS starts,
               (array_agg(job_end ORDER BY ord) FILTER (WHERE job_end IS NOT NULL))[1] AS job_end
          FROM c WHERE verdict = 'ok' GROUP BY job
        UNION ALL
        SELECT s.job, 0, 0, 0, true, NULL
          FROM json_to_recordset(starting) AS s (job TEXT, owner TEXT, token BIGINT)
          JOIN jobs j ON j.id = s.job
         WHERE j.status = 'queued'
           AND (s.owner IS NULL OR (j.lease_owner = s.owner AND j.lease_token = s.token))
    ), by_job AS (
        SELECT job, sum(nbytes) AS nbytes, sum(ndone) AS ndone, sum(nfailed) AS nfailed,
               bool_or(starts) AS starts, max(job_end) AS job_end
          FROM changes GROUP BY job
    ), changed AS (
        UPDATE jobs j
           SET nbytes = j.nbytes + c.nbytes, ndone = j.ndone + c.ndone,
               nfailed = j.nfailed + c.nfailed, updated_at = at,
               status = CASE WHEN j.status NOT IN ('queued', 'running') THEN j.status
                             WHEN c.job_end IS NOT NULL THEN c.job_end
                             WHEN c.starts THEN 'running'
                             ELSE j.status END,
               touched_at = CASE WHEN c.job_end IS NOT NULL
                                      AND j.status IN ('queued', 'running')
                                 THEN at ELSE j.touched_at END,
               lease_owner = CASE WHEN c.job_end IS NOT NULL
                                       AND j.status IN ('queued', 'running')
                                  THEN NULL ELSE j.lease_owner END
          FROM by_job c
         WHERE j.id = c.job
    )
    SELECT coalesce(array_agg(verdict ORDER BY ord), '{}'),
           coalesce(array_agg(job_status ORDER BY ord), '{}'),
           coalesce(sum(nbytes) FILTER (WHERE verdict = 'ok'), 0)
      INTO verdicts, seen, added
      FROM c;

    evicted := '{}';
    IF max_bytes IS NOT NULL THEN
        SELECT coalesce(sum(b.total), 0) + added INTO total FROM job_bytes b;
        kept := total;
        IF total > max_bytes AND pg_try_advisory_xact_lock(evict_lock) THEN
            WHILE kept > max_bytes LOOP
                SELECT id, nbytes INTO gone FROM jobs
                 WHERE status IN ('done', 'failed', 'partial', 'cancelled')
                 ORDER BY touched_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                DELETE FROM targets WHERE job_id = gone.id;
                DELETE FROM jobs WHERE id = gone.id;
                kept := kept - gone.nbytes;
                evicted := evicted || gone.id;
            END LOOP;
            added := added - (total - kept);
        END IF;
    END IF;
    IF added <> 0 THEN
        INSERT INTO job_bytes (slot, total) VALUES (my_slot, added)
            ON CONFLICT (slot) DO UPDATE SET total = job_bytes.total + excluded.total;
    END IF;
END $$
""",
    # ``store.runs.queue_waiting`` on the server: the checks a submit makes before
    # it writes, and its writes, in one call. Answers the verdict
    # (``taken``, ``stale``, ``free``, ``unsatisfiable``: nothing written;
    # ``queued``) and when the run was created, strictly after the last.
    """
CREATE FUNCTION store_queue_run(
    r_id TEXT, r_generation BIGINT, may_place BOOLEAN, placeable BOOLEAN,
    r_warnings TEXT, r_steps JSON, r_record TEXT, at DOUBLE PRECISION,
    OUT verdict TEXT, OUT queued_at DOUBLE PRECISION
) LANGUAGE plpgsql
AS $$
DECLARE
    last DOUBLE PRECISION;
BEGIN
    IF EXISTS (SELECT 1 FROM runs WHERE id = r_id) THEN
        verdict := 'taken';
    ELSIF (SELECT generation FROM node_generation) IS DISTINCT FROM r_generation THEN
        verdict := 'stale';
    ELSIF may_place AND ((SELECT count(*) FROM nodes) - (SELECT count(*) FROM leases) - (SELECT count(*) FROM nodes WHERE draining = 1    AND NOT EXISTS (SELECT 1 FROM leases WHERE leases.node_id = nodes.id)) > 0) THEN
        verdict := 'free';
    ELSIF NOT placeable THEN
        verdict := 'unsatisfiable';
    ELSE
        SELECT max(r.created_at) INTO last FROM runs r;
        queued_at := CASE WHEN last IS NULL OR at > last THEN at
                          ELSE last + greatest(abs(last) * 4.440892098500626e-16, 5e-324) END;
        INSERT INTO runs (id, state, created_at, warnings)
            VALUES (r_id, 'QUEUED', queued_at, r_warnings);
        INSERT INTO steps (run_id, seq, name, kind, needs)
            SELECT r_id, s.seq, s.name, s.kind, s.needs
              FROM json_to_recordset(r_steps) AS s (seq INTEGER, name TEXT, kind TEXT, needs TEXT);
        INSERT INTO records (run_id, state, opened_at, steps)
            VALUES (r_id, 'QUEUED', at, r_record);
        verdict := 'queued';
    END IF;
END $$
""",
    "ALTER TABLE store_commits ADD COLUMN answer JSON",
)

# -- step 10: upstream shares and holds ---------------------------------------------

_UPSTREAMS = (
    # Each runner's share of an upstream's limits (``store.jobs.upstreams``): how
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

_UPSTREAMS_PG = (
    """
        CREATE TABLE upstream_shares (
            upstream  TEXT    COLLATE "C" NOT NULL,
            runner_id TEXT    COLLATE "C" NOT NULL,
            demand    INTEGER NOT NULL CHECK (demand >= 0),
            slots     INTEGER NOT NULL CHECK (slots >= 0),
            rate      DOUBLE PRECISION NOT NULL CHECK (rate >= 0),
            seen_at   DOUBLE PRECISION NOT NULL,
            lapse     DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (upstream, runner_id)
        )
        """,
    """
        CREATE TABLE upstream_holds (
            upstream   TEXT COLLATE "C" PRIMARY KEY,
            held_until DOUBLE PRECISION NOT NULL
        )
        """,
)

# -- step 11: events ----------------------------------------------------------------

TARGET_STORED = """
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
    TARGET_STORED,
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

_EVENTS_PG = (
    """
    CREATE TABLE events (
        seq  BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        kind TEXT   NOT NULL,
        id   TEXT   COLLATE "C" NOT NULL,
        at   DOUBLE PRECISION NOT NULL,
        data TEXT   NOT NULL
    )
    """,
    """
    CREATE TABLE events_pruned (
        one   INTEGER PRIMARY KEY CHECK (one = 1),
        below INTEGER NOT NULL
    )
    """,
    "INSERT INTO events_pruned (one, below) VALUES (1, 0)",
    """
    CREATE FUNCTION store_now() RETURNS DOUBLE PRECISION LANGUAGE sql STABLE AS $$
        SELECT coalesce(nullif(current_setting('batch_store.now', true), '')::float8,
                        extract(epoch FROM clock_timestamp()))
    $$
    """,
    """
    CREATE FUNCTION store_jobs_submitted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO events (kind, id, at, data)
        SELECT 'job.submitted', n.id, store_now(),
               json_build_object('owner', n.owner, 'name', n.name, 'targets', n.ntargets)::text
          FROM fresh n ORDER BY n.seq;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER jobs_submitted AFTER INSERT ON jobs REFERENCING NEW TABLE AS fresh
    FOR EACH STATEMENT EXECUTE FUNCTION store_jobs_submitted()
    """,
    """
    CREATE FUNCTION store_job_moved() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO events (kind, id, at, data) VALUES (
            CASE TG_NAME WHEN 'job_started' THEN 'job.started' ELSE 'job.ended' END,
            NEW.id, store_now(),
            json_build_object('owner', NEW.owner, 'status',
                CASE TG_NAME WHEN 'job_started' THEN 'running' ELSE NEW.status END)::text);
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER job_started AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (OLD.status = 'queued' AND NEW.status IN ('running', 'done', 'failed', 'partial'))
    EXECUTE FUNCTION store_job_moved()
    """,
    """
    CREATE CONSTRAINT TRIGGER job_ended AFTER UPDATE OF status ON jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.status IN ('queued', 'running') AND NEW.status NOT IN ('queued', 'running'))
    EXECUTE FUNCTION store_job_moved()
    """,
    """
    CREATE FUNCTION store_targets_stored() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO events (kind, id, at, data)
        SELECT 'target.stored', a.job_id, store_now(),
               json_build_object('pos', a.pos, 'status', a.status)::text
          FROM stored_after a JOIN stored_before b USING (job_id, pos)
         WHERE b.status = 'pending' AND a.status <> 'pending'
         ORDER BY a.job_id, a.pos;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER targets_stored AFTER UPDATE ON targets
    REFERENCING OLD TABLE AS stored_before NEW TABLE AS stored_after
    FOR EACH STATEMENT EXECUTE FUNCTION store_targets_stored()
    """,
    """
    CREATE FUNCTION store_run_moved() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO events (kind, id, at, data) VALUES (
            CASE WHEN TG_OP = 'INSERT' AND NEW.state = 'QUEUED' THEN 'run.queued'
                 WHEN TG_OP = 'INSERT' OR NEW.state = 'RUNNING' THEN 'run.started'
                 ELSE 'run.ended' END,
            NEW.id, store_now(),
            CASE TG_OP WHEN 'INSERT' THEN json_build_object('state', NEW.state)
                 ELSE json_build_object('state', NEW.state, 'reason', NEW.reason) END::text);
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER run_submitted AFTER INSERT ON runs FOR EACH ROW
    EXECUTE FUNCTION store_run_moved()
    """,
    """
    CREATE TRIGGER run_moved AFTER UPDATE OF state ON runs FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state) EXECUTE FUNCTION store_run_moved()
    """,
    # The notice carries the events (``store.engines.TOLD``), so that a watcher
    # need not read them; when they do not fit, it only says there are some.
    """
    CREATE FUNCTION store_events_notice() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        told TEXT;
    BEGIN
        SELECT json_agg(json_build_array(seq, kind, id, at, data) ORDER BY seq)::text
          INTO told FROM added;
        IF told IS NOT NULL THEN
            PERFORM pg_notify('batch_store', CASE WHEN octet_length(told) <= 7900
                THEN 'event:' || told ELSE 'event' END);
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER events_notice AFTER INSERT ON events REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION store_events_notice()
    """,
)

STEPS = (
    Step(_BYTE_SLOTS, _BYTE_SLOTS_PG),
    Step(_UPSTREAMS, _UPSTREAMS_PG),
    Step(_EVENTS, _EVENTS_PG),
)
