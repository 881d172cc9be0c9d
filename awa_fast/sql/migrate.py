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
    revision integer NOT NULL,
    version integer NOT NULL,
    catalog text NOT NULL,
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

# A fingerprint of the schema's functions and triggers as the catalog has them (each
# function's signature, body and settings; each trigger's table, timing, events, columns,
# condition, function, arguments and whether it is enabled): recorded when the routines are
# applied, so that one dropped, disabled or redefined by hand afterwards is seen. Raw catalog
# columns, not pg_get_triggerdef (which locks the table to print a WHEN condition) nor names
# printed by search_path: no lock on any table of the schema, the same text from any session.
ROUTINES_CATALOG = f"""(SELECT md5(coalesce(string_agg(def, E'\\n' ORDER BY def), '')) FROM (
    SELECT concat_ws(' ', p.proname, p.proargtypes::text, p.prorettype, p.prolang, p.prosrc,
                     p.proconfig::text) AS def
    FROM pg_proc AS p WHERE p.pronamespace = '{S}'::regnamespace
    UNION ALL
    SELECT concat_ws(' ', c.relname, t.tgname, t.tgfoid, t.tgtype,
                     t.tgenabled, t.tgattr::text, t.tgqual::text, t.tgargs::text,
                     t.tgoldtable, t.tgnewtable)
    FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
    WHERE c.relnamespace = '{S}'::regnamespace AND NOT t.tgisinternal
) AS routine)"""

# The routines' digest and revision last applied, the catalog's fingerprint then and now, and
# the newest version recorded: the runner applies its routines again when their digest differs
# and neither the routines nor the schema are newer than the package's, or when its own were
# changed by hand since.
ROUTINES_STATE = (
    f"SELECT r.sha256, r.revision, r.catalog, {ROUTINES_CATALOG}, "
    f"(SELECT max(version) FROM {S}.schema_version) "
    f"FROM (SELECT) AS one LEFT JOIN {S}.schema_routines AS r ON true"
)

# (digest, revision, newest migration version of the package that applied them), and the
# catalog's fingerprint with them in place.
ROUTINES_RECORD = (
    f"INSERT INTO {S}.schema_routines (sha256, revision, version, catalog) "
    f"VALUES (%s, %s, %s, {ROUTINES_CATALOG}) "
    "ON CONFLICT (singleton) DO UPDATE SET sha256 = EXCLUDED.sha256, "
    "revision = EXCLUDED.revision, version = EXCLUDED.version, catalog = EXCLUDED.catalog, "
    "applied_at = now()"
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
