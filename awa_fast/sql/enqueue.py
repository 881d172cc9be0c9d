"""Inserting jobs: one, many (``unnest``), a keyed batch in unique-key order, ``COPY``, the
follow-ups of an outcome (``jsonb_to_recordset``) and the bridge's insert for other drivers.
"""

from awa_fast.sql.fragments import JOB_COLUMNS, S

_INSERT_TARGET = (
    f"INSERT INTO {S}.jobs (kind, queue, args, state, priority, max_attempts, run_at, metadata, "
    "tags, unique_key, unique_states, ordering_key)"
)

# Any explicit run_at, even past, makes the job scheduled (awa-pg's rule; promotion makes it
# available when due); none makes it available now.
_INSERT_PROJECTION = f"""
SELECT v.kind, v.queue, v.args::jsonb,
       (CASE WHEN v.run_at IS NOT NULL THEN 'scheduled' ELSE 'available' END)::{S}.job_state,
       v.priority, v.max_attempts, COALESCE(v.run_at, now()), v.metadata::jsonb, v.tags,
       v.unique_key, v.unique_states, v.ordering_key"""

_INSERT_ONE_ROW = """
FROM (VALUES (%s::text, %s::text, %s::text, %s::smallint, %s::smallint, %s::timestamptz, %s::text,
              %s::text[], %s::bytea, %s::smallint, %s::bytea))
     AS v(kind, queue, args, priority, max_attempts, run_at, metadata, tags, unique_key,
          unique_states, ordering_key)"""

INSERT_ONE = f"""{_INSERT_TARGET}{_INSERT_PROJECTION}{_INSERT_ONE_ROW}
RETURNING {JOB_COLUMNS}"""

# The client's own inserts commit without the trigger's NOTIFY and wake their queues after the
# commit (awa_fast/wake.py, ADR 018): awa_fast.defer_notify, transaction-local, read by the
# statement trigger (migration 009). INSERT_ONE runs alone, so it sets it itself (the one-row
# join is evaluated before the statement's trigger fires); a transaction runs DEFER_NOTIFY first.
DEFER_NOTIFY = "SELECT set_config('awa_fast.defer_notify', 'on', true)"

INSERT_ONE_DEFERRING_NOTIFY = f"""{_INSERT_TARGET}{_INSERT_PROJECTION}{_INSERT_ONE_ROW}
     CROSS JOIN ({DEFER_NOTIFY}) AS deferred
RETURNING {JOB_COLUMNS}"""

# Tags travel as one JSON array per row: Postgres arrays cannot be ragged.
_INSERT_MANY_ROWS = """
FROM (SELECT {id}u.kind, u.queue, u.args, u.priority, u.max_attempts, u.run_at, u.metadata,
             CASE WHEN u.tags = '[]' THEN '{{}}'::text[]
                  ELSE ARRAY(SELECT jsonb_array_elements_text(u.tags::jsonb)) END AS tags,
             u.unique_key, u.unique_states, u.ordering_key
      FROM unnest(%s::text[], %s::text[], %s::text[], %s::smallint[], %s::smallint[],
                  %s::timestamptz[], %s::text[], %s::text[], %s::bytea[], %s::smallint[],
                  %s::bytea[]){ordinality}
           AS u(kind, queue, args, priority, max_attempts, run_at, metadata, tags, unique_key,
                unique_states, ordering_key{ord}){order}) AS v"""

INSERT_MANY = f"""{_INSERT_TARGET}{_INSERT_PROJECTION}{_INSERT_MANY_ROWS.format(id="", ordinality="", ord="", order="")}
RETURNING {JOB_COLUMNS}"""

# A batch with unique keys: ids are drawn in input order, rows are inserted in unique-key order
# (one global order of key locks, so two batches over the same keys cannot deadlock each other;
# the caller puts the returned rows back in id order).
_INSERT_TARGET_WITH_ID = _INSERT_TARGET.replace("(kind,", "(id, kind,", 1)

INSERT_MANY_KEYED = f"""{_INSERT_TARGET_WITH_ID}
SELECT v.id, {_INSERT_PROJECTION.split("SELECT ", 1)[1]}
{
    _INSERT_MANY_ROWS.format(
        id=f"nextval('{S}.jobs_id_seq') AS id, ",
        ordinality=" WITH ORDINALITY",
        ord=", ord",
        order=" ORDER BY u.ord",
    )
}
ORDER BY v.unique_key
RETURNING {JOB_COLUMNS}"""

# The COPY's first statement: its ids, its now(), and defer_notify for the transaction (one
# round trip fewer than running DEFER_NOTIFY first; the producer wakes the queues after commit).
COPY_RESERVE = f"""SELECT now(), array_agg(nextval('{S}.jobs_id_seq'))
FROM generate_series(1, %s) CROSS JOIN ({DEFER_NOTIFY}) AS deferred"""

COPY_JOBS = (
    f"COPY {S}.jobs (id, kind, queue, args, state, priority, max_attempts, run_at, metadata, "
    "tags, unique_key, unique_states, ordering_key, created_at) FROM STDIN"
)

# The per-job completion of a job with follow-ups (registered specs first, then staged requests,
# in order), as ONE statement: the guarded transition, then the inserts only if it matched.
# A follow-up whose unique key is held is skipped (ON CONFLICT on the dedup index, which also
# sees the trigger's own just-completed row); any other error fails the whole statement.
UNIQUE_CONFLICT_TARGET = (
    "(unique_key) WHERE unique_key IS NOT NULL "
    f"AND (unique_states & (1 << {S}.state_bit(state))) <> 0"
)


# Follow-up requests passed as one JSON array (enqueue.follow_ups_json), read back as rows and
# inserted with ON CONFLICT DO NOTHING. Ids are drawn in (trigger, order) order among the rows
# that pass ``where``; rows are inserted in unique-key order, so two completions whose
# follow-ups share keys wait for each other instead of deadlocking (ADR-046's deadlock-free
# multi-insert completion). A key a finished job holds (unique_holds) is skipped too:
# finished_holds_key locks the key and looks with a fresh snapshot, after any completion in
# flight on it committed (in key order: it runs on the sorted rows). ``completing``: a CTE of
# rows this statement completes (unique_key, unique_states), whose keys are held as of now.
def _follow_ups_insert(where: str, completing: str | None = None) -> str:
    own = (
        ""
        if completing is None
        else f"""NOT EXISTS (SELECT 1 FROM {completing} c WHERE c.unique_key = v.unique_key
                            AND (c.unique_states & (1 << {S}.state_bit('completed'))) <> 0)
             AND """
    )
    return f"""{_INSERT_TARGET_WITH_ID}
    SELECT v.id, v.kind, v.queue, v.args, v.state, v.priority, v.max_attempts,
           COALESCE(v.run_at, now()), v.metadata, v.tags, v.unique_key, v.unique_states,
           v.ordering_key
    FROM (SELECT v.* FROM (
          SELECT nextval('{S}.jobs_id_seq') AS id, r.kind, r.queue, r.args,
                 (CASE WHEN r.run_at IS NOT NULL THEN 'scheduled'
                       ELSE 'available' END)::{S}.job_state AS state,
                 r.priority, r.max_attempts, r.run_at, r.metadata, r.tags,
                 decode(r.unique_key, 'hex') AS unique_key, r.unique_states,
                 decode(r.ordering_key, 'hex') AS ordering_key
          FROM jsonb_to_recordset(%s::jsonb)
               AS r(trigger bigint, lease bigint, ord int, kind text, queue text, args jsonb,
                    priority smallint, max_attempts smallint, run_at timestamptz, metadata jsonb,
                    tags text[], unique_key text, unique_states smallint, ordering_key text)
          WHERE {where}
          ORDER BY r.trigger, r.ord) AS v
          ORDER BY v.unique_key, v.id
          OFFSET 0) AS v  -- a fence: the key checks below run on the sorted rows
    WHERE v.unique_key IS NULL
       OR (v.unique_states & (1 << {S}.state_bit(v.state))) = 0
       OR ({own}NOT {S}.finished_holds_key(v.unique_key))
    ORDER BY v.unique_key, v.id
    ON CONFLICT {UNIQUE_CONFLICT_TARGET} DO NOTHING"""


# Follow-ups inserted inside a caller's transaction (failure settlement, external completion,
# other outcomes): one statement, keys in key order, held keys skipped. Returns the count.
INSERT_FOLLOW_UPS = f"""
WITH ins AS (
    {_follow_ups_insert("true")}
    RETURNING 1
)
SELECT count(*) FROM ins"""

# awa_fast.bridge for drivers other than psycopg 3 (asyncpg, SQLAlchemy, Django): the same
# insert returning the row as one JSON text value, so every driver reads it the same way.
BRIDGE_INSERT = f"WITH j AS ({INSERT_ONE}) SELECT row_to_json(j)::text FROM j"

# ... with $1..$n placeholders (asyncpg, SQLAlchemy's numeric_dollar paramstyle).
BRIDGE_INSERT_DOLLAR = BRIDGE_INSERT
for _n in range(1, BRIDGE_INSERT.count("%s") + 1):
    BRIDGE_INSERT_DOLLAR = BRIDGE_INSERT_DOLLAR.replace("%s", f"${_n}", 1)
del _n

# Transactional enqueue (awa_fast.transaction): the client opens the transaction on a pooled
# autocommit connection and ends it.
TX_BEGIN = "BEGIN"
TX_COMMIT = "COMMIT"
TX_ROLLBACK = "ROLLBACK"
