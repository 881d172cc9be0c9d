"""The statements of ``awa-fast demo`` (awa_fast/demo.py): its results table and the reads
that report a run. Imported on its own (``from awa_fast.sql import demo``), like ``dashboard``.
"""

from awa_fast.sql.fragments import S

# The demo's own table: one row per module name stage B resolved.
RESULTS_TABLE = "awa_fast_demo_modules"

CREATE_RESULTS = (
    f"CREATE TABLE IF NOT EXISTS {RESULTS_TABLE} (name text PRIMARY KEY, "
    "found boolean NOT NULL, origin text, size bigint)"
)

TRUNCATE_RESULTS = f"TRUNCATE {RESULTS_TABLE}"

# Stage B's record of one module (idempotent: a redone job writes the same row).
UPSERT_RESULT = f"""
INSERT INTO {RESULTS_TABLE} (name, found, origin, size) VALUES (%s, %s, %s, %s)
ON CONFLICT (name) DO UPDATE SET found = EXCLUDED.found, origin = EXCLUDED.origin,
                                 size = EXCLUDED.size"""

RESULT_TOTALS = f"""
SELECT count(*) FILTER (WHERE found), count(*) FILTER (WHERE NOT found), coalesce(sum(size), 0)
FROM {RESULTS_TABLE}"""

# Params of the next five: the demo's kinds (a list; DELETE_JOBS takes it as %(kinds)s).
COUNTS = f"""
SELECT kind, state::text, count(*) FROM {S}.jobs_all
WHERE kind = ANY(%s) GROUP BY 1, 2"""

DELETE_JOBS = f"""
WITH f AS (DELETE FROM {S}.jobs_done WHERE kind = ANY(%(kinds)s))
DELETE FROM {S}.jobs WHERE kind = ANY(%(kinds)s)"""

DELETE_DLQ = f"DELETE FROM {S}.dlq WHERE kind = ANY(%s)"

# Run after the demo's workers stopped, so a 'running' row belongs to no one. Params: kinds,
# queue.
REMOVE_UNFINISHED = f"""
DELETE FROM {S}.jobs WHERE kind = ANY(%s) AND queue = %s
AND state IN ('available', 'scheduled', 'retryable', 'running')"""

# Params of the rest: one kind.
FAILURES = f"""
SELECT args->>'path', split_part(errors->-1->>'error', E'\\n', 1) FROM {S}.jobs_all
WHERE kind = %s AND state = 'failed' ORDER BY args->>'path'"""

ARG_NAMES = f"SELECT args->>'name' FROM {S}.jobs_all WHERE kind = %s"

CONTINUATIONS = f"SELECT count(*) FROM {S}.jobs_all WHERE kind = %s AND (args->>'offset')::int > 0"
