"""The migration runner's bookkeeping (awa_fast/schema): its lock, the version table, and the
record of each applied migration. The migrations themselves are awa_fast/schema/*.sql.
"""

from awa_fast.sql.fragments import S

# Held for one migration's transaction: concurrent migrate() calls apply each version once.
MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(%s)"

MIGRATION_BOOTSTRAP = f"""
CREATE SCHEMA IF NOT EXISTS {S};
CREATE TABLE IF NOT EXISTS {S}.schema_version (
    version integer PRIMARY KEY,
    description text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

MIGRATION_APPLIED = f"SELECT 1 FROM {S}.schema_version WHERE version = %s"

MIGRATION_RECORD = f"INSERT INTO {S}.schema_version (version, description) VALUES (%s, %s)"
