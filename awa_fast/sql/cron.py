"""Periodic (cron) jobs: awa_fast/periodic.py, migration 003."""

from awa_fast.sql.fragments import S

CRON_COLUMNS = (
    "name, cron_expr, timezone, kind, queue, args, priority, max_attempts, tags, metadata, "
    "missed_fire_policy, last_fire_at, created_at, updated_at"
)

# Register a schedule. A new row starts never fired (last_fire_at NULL, created_at now: awa's
# first-registration rule in periodic.due_fires). An unchanged cron_expr + timezone keeps its
# last_fire_at (so fires missed while no leader ran are still seen); a changed one restarts from
# max(old, %(initial)s), the latest fire time <= now; a never-fired row stays never fired. An
# identical definition is not rewritten at all.
CRON_UPSERT = f"""
INSERT INTO {S}.cron_jobs AS c (name, cron_expr, timezone, kind, queue, args, priority,
                                max_attempts, tags, metadata, missed_fire_policy, last_fire_at)
VALUES (%(name)s, %(cron_expr)s, %(timezone)s, %(kind)s, %(queue)s, %(args)s::jsonb,
        %(priority)s, %(max_attempts)s, %(tags)s::text[], %(metadata)s::jsonb,
        %(missed_fire_policy)s, NULL)
ON CONFLICT (name) DO UPDATE SET
    cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone, kind = EXCLUDED.kind,
    queue = EXCLUDED.queue, args = EXCLUDED.args, priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts, tags = EXCLUDED.tags, metadata = EXCLUDED.metadata,
    missed_fire_policy = EXCLUDED.missed_fire_policy,
    last_fire_at = CASE
        WHEN c.last_fire_at IS NULL
             OR (c.cron_expr = EXCLUDED.cron_expr AND c.timezone = EXCLUDED.timezone)
        THEN c.last_fire_at
        ELSE GREATEST(c.last_fire_at, %(initial)s::timestamptz) END,
    updated_at = now()
WHERE (c.cron_expr, c.timezone, c.kind, c.queue, c.args, c.priority, c.max_attempts, c.tags,
       c.metadata, c.missed_fire_policy)
      IS DISTINCT FROM
      (EXCLUDED.cron_expr, EXCLUDED.timezone, EXCLUDED.kind, EXCLUDED.queue, EXCLUDED.args,
       EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.tags, EXCLUDED.metadata,
       EXCLUDED.missed_fire_policy)"""

CRON_NOW = "SELECT statement_timestamp()"

# Unlocked scan: which schedules may be due (the locked re-check decides). The definition's
# text tells a schedule whose problem was warned about from one edited since (periodic.evaluate).
CRON_SCAN = f"""
SELECT name, cron_expr, timezone, last_fire_at, created_at, statement_timestamp() AS now,
       (cron_expr, timezone, kind, queue, args, priority, max_attempts, tags, metadata,
        missed_fire_policy)::text AS definition
FROM {S}.cron_jobs ORDER BY name"""

# Inside the firing transaction: lock one schedule and read it again.
CRON_LOCK = f"""
SELECT {CRON_COLUMNS}, statement_timestamp() AS now
FROM {S}.cron_jobs WHERE name = %s FOR UPDATE"""

CRON_ADVANCE = f"UPDATE {S}.cron_jobs SET last_fire_at = %s WHERE name = %s"

CRON_LIST = f"SELECT {CRON_COLUMNS} FROM {S}.cron_jobs ORDER BY name"

CRON_DELETE = f"DELETE FROM {S}.cron_jobs WHERE name = %s"
