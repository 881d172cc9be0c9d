"""Queue and job-kind descriptors: awa_fast/descriptors.py, migration 007."""

from awa_fast.sql.fragments import S


def _descriptor_upsert(table: str, key: str) -> str:
    return f"""
INSERT INTO {S}.{table} AS d ({key}, display_name, description, owner, docs_url, tags, extra,
                               descriptor_hash)
VALUES (%(name)s, %(display_name)s, %(description)s, %(owner)s, %(docs_url)s, %(tags)s::text[],
        %(extra)s::jsonb, %(hash)s)
ON CONFLICT ({key}) DO UPDATE SET
    display_name = EXCLUDED.display_name, description = EXCLUDED.description,
    owner = EXCLUDED.owner, docs_url = EXCLUDED.docs_url, tags = EXCLUDED.tags,
    extra = EXCLUDED.extra, descriptor_hash = EXCLUDED.descriptor_hash,
    updated_at = CASE WHEN d.descriptor_hash = EXCLUDED.descriptor_hash THEN d.updated_at
                      ELSE now() END,
    last_seen_at = now()"""


QUEUE_DESCRIPTOR_UPSERT = _descriptor_upsert("queue_descriptors", "queue")

KIND_DESCRIPTOR_UPSERT = _descriptor_upsert("job_kind_descriptors", "kind")

# Rows no runtime has refreshed for %(retention_s)s seconds (descriptor_retention_days; NULL:
# kept forever).
DESCRIPTORS_PRUNE = f"""
WITH q AS (DELETE FROM {S}.queue_descriptors
           WHERE last_seen_at < now() - %(retention_s)s::float8 * interval '1 second'
           RETURNING 1),
     k AS (DELETE FROM {S}.job_kind_descriptors
           WHERE last_seen_at < now() - %(retention_s)s::float8 * interval '1 second'
           RETURNING 1)
SELECT (SELECT count(*) FROM q) + (SELECT count(*) FROM k)"""

DESCRIPTOR_COLUMNS = (
    "display_name, description, owner, docs_url, tags, extra, descriptor_hash, "
    "created_at, updated_at, last_seen_at"
)

LIST_QUEUE_DESCRIPTORS = (
    f"SELECT queue AS name, {DESCRIPTOR_COLUMNS} FROM {S}.queue_descriptors ORDER BY queue"
)

LIST_KIND_DESCRIPTORS = (
    f"SELECT kind AS name, {DESCRIPTOR_COLUMNS} FROM {S}.job_kind_descriptors ORDER BY kind"
)
