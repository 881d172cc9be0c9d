"""A schema's catalog as comparable rows: every definition PostgreSQL keeps for the objects in
one schema, read from the system catalogs (no pg_dump: its version must match the server's).

:func:`catalog` returns one sorted list of tuples per section; two schemas built by different
routes (the baseline, the migrations in order) are the same schema when every section is equal.
:func:`differences` names what is not. Object identity (oids, attnums with dropped columns'
gaps) is left out; names, column order, definitions, storage settings, statistics targets,
comments, privileges, owners and the rows a migration seeds are in.
"""

from __future__ import annotations

from collections import Counter

import psycopg
from psycopg import sql as psql

# Each query takes the schema name as %(s)s. Text a definition prints with the schema's name
# in it stays as printed: both sides of a comparison use the same name.
SECTIONS: dict[str, str] = {
    "schema": """
        SELECT n.nspname, pg_get_userbyid(n.nspowner), n.nspacl::text,
               obj_description(n.oid, 'pg_namespace')
        FROM pg_namespace n WHERE n.nspname = %(s)s""",
    # every object the schema holds, as PostgreSQL names it (a safety net for kinds of object
    # the sections below do not read in detail: operators, collations, text search, ...)
    "objects": """
        SELECT pg_describe_object(x.classid, x.objid, 0) FROM (
            SELECT 'pg_class'::regclass AS classid, c.oid AS objid, c.relnamespace AS ns
              FROM pg_class c
            UNION ALL SELECT 'pg_proc'::regclass, p.oid, p.pronamespace FROM pg_proc p
            UNION ALL SELECT 'pg_type'::regclass, t.oid, t.typnamespace FROM pg_type t
            UNION ALL SELECT 'pg_constraint'::regclass, o.oid, o.connamespace
              FROM pg_constraint o
            UNION ALL SELECT 'pg_operator'::regclass, o.oid, o.oprnamespace FROM pg_operator o
            UNION ALL SELECT 'pg_opclass'::regclass, o.oid, o.opcnamespace FROM pg_opclass o
            UNION ALL SELECT 'pg_opfamily'::regclass, o.oid, o.opfnamespace FROM pg_opfamily o
            UNION ALL SELECT 'pg_collation'::regclass, o.oid, o.collnamespace
              FROM pg_collation o
            UNION ALL SELECT 'pg_conversion'::regclass, o.oid, o.connamespace
              FROM pg_conversion o
            UNION ALL SELECT 'pg_statistic_ext'::regclass, o.oid, o.stxnamespace
              FROM pg_statistic_ext o
            UNION ALL SELECT 'pg_ts_config'::regclass, o.oid, o.cfgnamespace FROM pg_ts_config o
            UNION ALL SELECT 'pg_ts_dict'::regclass, o.oid, o.dictnamespace FROM pg_ts_dict o
            UNION ALL SELECT 'pg_ts_parser'::regclass, o.oid, o.prsnamespace FROM pg_ts_parser o
            UNION ALL SELECT 'pg_ts_template'::regclass, o.oid, o.tmplnamespace
              FROM pg_ts_template o
        ) x JOIN pg_namespace n ON n.oid = x.ns WHERE n.nspname = %(s)s""",
    "relations": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text, am.amname,
               pg_get_userbyid(c.relowner), c.relacl::text,
               ARRAY(SELECT o FROM unnest(coalesce(c.reloptions, '{}')) o ORDER BY o)::text,
               c.relispartition, pg_get_expr(c.relpartbound, c.oid),
               CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END,
               ARRAY(SELECT i.inhparent::regclass::text FROM pg_inherits i
                     WHERE i.inhrelid = c.oid ORDER BY 1)::text,
               c.relrowsecurity, c.relforcerowsecurity, c.relreplident::text,
               t.spcname, obj_description(c.oid, 'pg_class'),
               CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END,
               CASE WHEN c.relkind IN ('v', 'm') THEN c.reloftype <> 0 END
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_am am ON am.oid = c.relam
        LEFT JOIN pg_tablespace t ON t.oid = c.reltablespace
        WHERE n.nspname = %(s)s""",
    # position: the column's rank among the live ones (a dropped column leaves a gap in attnum
    # that a schema created in one step does not have, and that no statement can see)
    "columns": """
        SELECT c.relname,
               row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
               a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, a.attgenerated::text,
               a.attstattarget, a.attstorage::text, a.attcompression::text, co.collname,
               a.attoptions::text, a.attfdwoptions::text, a.attislocal, a.attinhcount,
               a.attacl::text, col_description(a.attrelid, a.attnum)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
        WHERE n.nspname = %(s)s AND a.attnum > 0 AND NOT a.attisdropped""",
    "indexes": """
        SELECT ic.relname, pg_get_indexdef(i.indexrelid), i.indisunique, i.indisprimary,
               i.indisexclusion, i.indimmediate, i.indisclustered, i.indisvalid,
               i.indisreplident, i.indnullsnotdistinct
        FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = ic.relnamespace
        WHERE n.nspname = %(s)s""",
    "constraints": """
        SELECT coalesce(c.relname, ty.typname), o.conname, o.contype::text,
               pg_get_constraintdef(o.oid), o.condeferrable, o.condeferred, o.convalidated,
               o.conislocal, o.coninhcount, o.connoinherit,
               (SELECT ci.relname FROM pg_class ci WHERE ci.oid = o.conindid),
               obj_description(o.oid, 'pg_constraint')
        FROM pg_constraint o JOIN pg_namespace n ON n.oid = o.connamespace
        LEFT JOIN pg_class c ON c.oid = o.conrelid
        LEFT JOIN pg_type ty ON ty.oid = o.contypid
        WHERE n.nspname = %(s)s""",
    # the whole definition as PostgreSQL prints it: arguments, result, language, volatility,
    # parallel safety, strictness, security, cost, settings and the body as written
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prokind::text,
               CASE WHEN p.prokind <> 'a' THEN pg_get_functiondef(p.oid) END,
               p.procost, p.prorows, p.proleakproof, p.proconfig::text,
               pg_get_userbyid(p.proowner), p.proacl::text, obj_description(p.oid, 'pg_proc')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(s)s""",
    # internal triggers (foreign keys) are their constraints'; a partition's clone of its
    # parent's row trigger is listed on the partition
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled::text,
               t.tgparentid <> 0, obj_description(t.oid, 'pg_trigger')
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND NOT t.tgisinternal""",
    "rules_and_policies": """
        SELECT c.relname, r.rulename, pg_get_ruledef(r.oid) FROM pg_rewrite r
        JOIN pg_class c ON c.oid = r.ev_class JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND r.rulename <> '_RETURN'
        UNION ALL
        SELECT c.relname, p.polname,
               concat_ws(' ', p.polcmd, p.polpermissive, p.polroles::text,
                         pg_get_expr(p.polqual, p.polrelid),
                         pg_get_expr(p.polwithcheck, p.polrelid))
        FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(s)s""",
    "sequences": """
        SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
               s.seqmax, s.seqmin, s.seqcache, s.seqcycle,
               (SELECT d.refobjid::regclass::text || '.' || a.attname || ' ' || d.deptype::text
                FROM pg_depend d JOIN pg_attribute a
                  ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                  AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
        FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(s)s""",
    "types": """
        SELECT t.typname, t.typtype::text, format_type(t.typbasetype, t.typtypmod),
               t.typnotnull, t.typdefault,
               ARRAY(SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid
                     ORDER BY e.enumsortorder)::text,
               pg_get_userbyid(t.typowner), t.typacl::text, obj_description(t.oid, 'pg_type')
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = %(s)s""",
    "default_privileges": """
        SELECT d.defaclobjtype::text, d.defaclacl::text, pg_get_userbyid(d.defaclrole)
        FROM pg_default_acl d JOIN pg_namespace n ON n.oid = d.defaclnamespace
        WHERE n.nspname = %(s)s""",
    # comments on columns of anything, and on objects the sections above do not comment
    "comments": """
        SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
        FROM pg_description d JOIN pg_depend dep
          ON dep.classid = d.classoid AND dep.objid = d.objoid
        JOIN pg_namespace n ON dep.refclassid = 'pg_namespace'::regclass
          AND dep.refobjid = n.oid
        WHERE n.nspname = %(s)s""",
}

# Rows a migration writes into a table (the leader's and the lease's singleton rows); a column
# the runner fills with the time of the run is left out, and so is the routines' catalog
# fingerprint (it names object ids, which differ between databases).
_ROWS_SKIPPED = {"schema_version": {"applied_at"}, "schema_routines": {"applied_at", "catalog"}}


def catalog(conn: psycopg.Connection, schema: str) -> dict[str, list[tuple]]:
    """Every section of ``schema``'s catalog on ``conn``, each a sorted list of tuples (values
    as text), plus ``rows``: the contents of each table (partitioned tables' rows under the
    partition), without the columns of :data:`_ROWS_SKIPPED`."""
    out: dict[str, list[tuple]] = {}
    for section, query in SECTIONS.items():
        rows = conn.execute(query, {"s": schema}).fetchall()
        out[section] = sorted(tuple("" if v is None else str(v) for v in r) for r in rows)
    tables = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 1""",
        (schema,),
    ).fetchall()
    contents = []
    for (table,) in tables:
        skipped = _ROWS_SKIPPED.get(table, set())
        columns = [
            name
            for (name,) in conn.execute(
                """SELECT a.attname FROM pg_attribute a WHERE a.attrelid = %s::regclass
                   AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""",
                (psql.Identifier(schema, table).as_string(conn),),
            ).fetchall()
            if name not in skipped
        ]
        query = psql.SQL("SELECT {} FROM {}").format(
            psql.SQL(", ").join(psql.SQL("{}::text").format(psql.Identifier(c)) for c in columns),
            psql.Identifier(schema, table),
        )
        for row in conn.execute(query).fetchall():
            contents.append((table, *(str(v) for v in row)))
    out["rows"] = sorted(contents)
    return out


def differences(left: dict[str, list[tuple]], right: dict[str, list[tuple]]) -> list[str]:
    """What differs between two :func:`catalog` results, one line per entry found on one side
    only (``- section: entry`` left only, ``+ section: entry`` right only); empty if none."""
    lines = []
    for section in sorted(set(left) | set(right)):
        a, b = Counter(left.get(section, [])), Counter(right.get(section, []))
        lines += [f"- {section}: {entry}" for entry in sorted((a - b).elements())]
        lines += [f"+ {section}: {entry}" for entry in sorted((b - a).elements())]
    return lines
