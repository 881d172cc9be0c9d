"""The migration runner's bookkeeping (awa_fast/schema): its lock, the version table, the
record of each applied migration and of the routines applied (ADR 043); and the same bookkeeping
around a migration printed to be run by hand (``awa-fast migrate --sql``). The migrations
themselves are awa_fast/schema/*.sql, the routines awa_fast/schema/routines/*.sql.
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
);
CREATE TABLE IF NOT EXISTS {S}.schema_routines (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    sha256 text NOT NULL,
    version integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

MIGRATION_APPLIED = f"SELECT 1 FROM {S}.schema_version WHERE version = %s"

# Has the schema any version recorded? If not, the runner creates it from the baseline.
MIGRATION_ANY_APPLIED = f"SELECT 1 FROM {S}.schema_version LIMIT 1"

MIGRATION_RECORD = (
    f"INSERT INTO {S}.schema_version (version, description) VALUES (%s, %s) "
    "ON CONFLICT (version) DO NOTHING"
)

# The routines' digest last applied, and the newest version recorded: the runner applies its
# routines again only when their digest differs and the schema is not newer than the package.
ROUTINES_STATE = (
    f"SELECT (SELECT sha256 FROM {S}.schema_routines), "
    f"(SELECT max(version) FROM {S}.schema_version)"
)

ROUTINES_RECORD = (
    f"INSERT INTO {S}.schema_routines (sha256, version) VALUES (%s, %s) "
    "ON CONFLICT (singleton) DO UPDATE SET sha256 = EXCLUDED.sha256, "
    "version = EXCLUDED.version, applied_at = now()"
)

# A migration as a script to run by hand (psql; schema.migration_scripts(), `awa-fast migrate
# --sql`): what the runner does, in one transaction of its own. The opening block takes the
# runner's lock, creates the version table (MIGRATION_BOOTSTRAP) and refuses a migration already
# recorded, or one whose predecessor is not, so that the transaction is rolled back before the
# migration runs; then the migration and its record (MIGRATION_RECORD). READ COMMITTED as the
# runner's session (SESSION_READ_COMMITTED); NOTICEs ("already exists,
# skipping") are not printed. %(lock_key)s, %(version)s and %(previous)s are integers, spliced in.
MIGRATION_SCRIPT_OPEN = f"""BEGIN ISOLATION LEVEL READ COMMITTED;
SET LOCAL client_min_messages = warning;
DO $awa_fast_migration$
BEGIN
    PERFORM pg_advisory_xact_lock(%(lock_key)s);
    %(bootstrap)s;
    IF EXISTS (SELECT FROM {S}.schema_version WHERE version = %(version)s) THEN
        RAISE EXCEPTION 'awa_fast migration %(version)s is already applied';
    END IF;
    IF %(previous)s > 0 AND NOT EXISTS (SELECT FROM {S}.schema_version
                                         WHERE version = %(previous)s) THEN
        RAISE EXCEPTION 'awa_fast migration %(previous)s is not applied: apply the migrations in '
                        'order (awa-fast migrate --pending prints the missing ones)';
    END IF;
END
$awa_fast_migration$;
"""

MIGRATION_SCRIPT_CLOSE = "%(record)s;\nCOMMIT;"
