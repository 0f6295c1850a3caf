"""What batonq put in a database, read from PostgreSQL's catalogs: two
databases with equal snapshots have the same schema, engine and grants."""

from __future__ import annotations

import collections
import re
from typing import Any

import psycopg

__all__ = ["functions", "snapshot"]

# Each query returns rows that name no oid, so two databases compare equal.
_QUERIES = {
    "relations": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text, coalesce(c.relacl::text, ''),
               coalesce(pg_get_partkeydef(c.oid), ''), coalesce(pg_get_expr(c.relpartbound, c.oid), '')
          FROM pg_class c WHERE c.relnamespace = 'batonq'::regnamespace""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity::text
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'batonq'::regnamespace AND c.relkind IN ('r', 'p', 'c', 'v', 'u')
           AND a.attnum > 0 AND NOT a.attisdropped""",
    "indexes": """
        SELECT c.relname, pg_get_indexdef(i.indexrelid)
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE c.relnamespace = 'batonq'::regnamespace""",
    "constraints": """
        SELECT t.relname, k.conname, pg_get_constraintdef(k.oid)
          FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid
         WHERE k.connamespace = 'batonq'::regnamespace""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_function_result(p.oid), p.prokind::text,
               p.provolatile::text, p.prosecdef, coalesce(p.proacl::text, ''),
               coalesce(p.proconfig::text, ''), md5(pg_get_functiondef(p.oid))
          FROM pg_proc p WHERE p.pronamespace = 'batonq'::regnamespace""",
    "triggers": """
        SELECT c.relname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'batonq'::regnamespace AND NOT t.tgisinternal""",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid)
          FROM pg_class c WHERE c.relnamespace = 'batonq'::regnamespace AND c.relkind IN ('v', 'm')""",
    "types": """
        SELECT t.typname, t.typtype::text, coalesce(t.typacl::text, '')
          FROM pg_type t WHERE t.typnamespace = 'batonq'::regnamespace""",
    "schema": """
        SELECT n.nspname, coalesce(n.nspacl::text, '') FROM pg_namespace n WHERE n.nspname = 'batonq'""",
    "roles": """
        SELECT r.rolname, r.rolcanlogin, array(SELECT m.rolname FROM pg_auth_members a
                                               JOIN pg_roles m ON m.oid = a.roleid
                                              WHERE a.member = r.oid ORDER BY 1)::text
          FROM pg_roles r WHERE r.rolname IN ('batonq_reader', 'batonq_worker')""",
}


def _undated(value: Any) -> Any:
    """Day partitions are named and bounded by date: compare them by shape."""
    if not isinstance(value, str):
        return value
    value = re.sub(r"_\d{8}\b", "_YYYYMMDD", value)
    return re.sub(r"'\d{4}-\d{2}-\d{2}[^']*'", "'DATE'", value)


def snapshot(dsn: str) -> dict[str, collections.Counter[tuple[Any, ...]]]:
    """Every relation, column, index, constraint, function (signature, result,
    settings, grants, a hash of its definition), trigger, view, type, the
    schema's grants and the roles, as comparable multisets."""
    with psycopg.connect(dsn) as conn:
        return {
            name: collections.Counter(tuple(_undated(v) for v in row) for row in conn.execute(query))
            for name, query in _QUERIES.items()
        }


def functions(dsn: str) -> set[str]:
    """The batonq schema's functions by signature, e.g. ``batonq.sweep()``."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'batonq'::regnamespace"
        )
        return {signature for (signature,) in rows}
