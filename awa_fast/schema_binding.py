"""The schema an application's awa-fast objects live in, and how every statement is bound to it
(ADR 027).

awa-fast's statements (awa_fast/sql/) and migrations (awa_fast/schema/*.sql) are written for the
default schema ``awa_fast``. A :class:`SchemaBinding` of another schema ``s`` rewrites a text
once, with these rules, longest match first:

- ``'awa_fast_cancel'`` / ``"awa_fast_cancel"`` (the cancel channel) -> ``s:cancel``, and
  ``'awa_fast'`` / ``"awa_fast"`` (the wake-up channel, the schema named as a literal) -> ``s``:
  a ``:`` is not allowed in a schema name, so no channel of one schema is another's;
- ``'awa_fast.`` (a literal naming an object or a custom setting such as
  ``awa_fast.defer_notify``) -> ``'s.``;
- ``awa_fast.`` (a qualified name) and a bare ``awa_fast`` (``CREATE SCHEMA awa_fast``) ->
  ``"s".`` / ``"s"``;
- the advisory-lock classes of the unique-key buckets, the finished slices' counters and the
  unique-key holders (two-int keys, migrations 010, 024, 026) -> classes derived from ``s``.

Session advisory-lock keys given as parameters (the maintenance leader's, the migration
runner's) are attributes: :attr:`SchemaBinding.leader_lock_key`,
:attr:`SchemaBinding.migrate_lock_key`. The default schema's binding rewrites nothing and keeps
every historical key, so a database migrated before configurable schemas is unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import re

from awa_fast.errors import ValidationError

DEFAULT_SCHEMA = "awa_fast"
# PostgreSQL's identifier limit (63 bytes) less the ":cancel" of the cancel channel's name,
# which must fit the same limit (a longer LISTEN name is truncated).
MAX_LENGTH = 56
ENV = "AWA_FAST_SCHEMA"

_NAME = re.compile(r"[a-z_][a-z0-9_]*")

# The default schema's session advisory-lock keys (sql.LEADER_LOCK_KEY, schema.MIGRATE_LOCK_KEY;
# arbitrary constants) and two-int lock classes spliced into migrations and statements.
_LEADER_KEY = 0x6177615F6C6561  # "awa_lea"
_MIGRATE_KEY = 0x6177615F6D6967  # "awa_mig"
_LOCK_CLASSES = (1635213685, 1635213686, 1635213687)

# A non-default binding's cache of rewritten texts: the hot path's statements are a few dozen
# module-level strings; texts of the application's own SQL on awa-fast's connections are not
# cached past this many (rewritten at each use).
_CACHE_LIMIT = 4096


def check_name(name: object, field: str = "schema") -> str:
    """``name`` if it may name an awa-fast schema; the rule: lowercase letters, digits and
    ``_``, not starting with a digit, at most :data:`MAX_LENGTH` (56) characters, not ``pg_*``
    nor ``information_schema`` (PostgreSQL's own) nor ``plpgsql`` (a reserved prefix of custom
    settings, which the schema's ``<name>.defer_notify`` is).

    Raises:
        ValidationError: naming ``field`` and the rule broken.
    """
    if not isinstance(name, str):
        raise ValidationError(
            f"{field} must be a str, got {type(name).__name__} {name!r}", field=field, limit="str"
        )
    if not _NAME.fullmatch(name):
        raise ValidationError(
            f"{field} {name!r} is not a schema name awa-fast accepts: lowercase letters, digits "
            "and '_', not starting with a digit",
            field=field,
            limit="[a-z_][a-z0-9_]*",
        )
    if len(name) > MAX_LENGTH:
        raise ValidationError(
            f"{field} {name!r} is {len(name)} characters long; at most {MAX_LENGTH} (63, "
            "PostgreSQL's identifier limit, less the ':cancel' of its cancel channel)",
            field=field,
            limit=f"<= {MAX_LENGTH} characters",
        )
    if name.startswith("pg_") or name in ("information_schema", "plpgsql"):
        raise ValidationError(
            f"{field} {name!r} is reserved by PostgreSQL", field=field, limit="not pg_*"
        )
    return name


def _derived(name: str, what: str, size: int) -> int:
    digest = hashlib.blake2b(f"{name}\0{what}".encode(), digest_size=size).digest()
    return int.from_bytes(digest, "big", signed=True)


class SchemaBinding:
    """One schema's names: statements rewritten for it, its channels and lock keys. Get one
    with :func:`bind` (one object per name).

    Attributes:
        name: the schema.
        is_default: ``name == "awa_fast"``: :meth:`rewrite` returns texts unchanged.
        channel_queue, channel_cancel: the LISTEN channels of wake-ups and cancels.
        leader_lock_key, migrate_lock_key: bigint session advisory-lock keys.
        lock_classes: the three two-int lock classes (buckets, slice counters, holders).
    """

    def __init__(self, name: str) -> None:
        self.name = check_name(name)
        self.is_default = name == DEFAULT_SCHEMA
        self._cache: dict[str, str] = {}
        if self.is_default:
            self.channel_queue, self.channel_cancel = "awa_fast", "awa_fast_cancel"
            self.leader_lock_key, self.migrate_lock_key = _LEADER_KEY, _MIGRATE_KEY
            self.lock_classes: tuple[int, ...] = _LOCK_CLASSES
            return
        self.channel_queue, self.channel_cancel = name, f"{name}:cancel"
        self.leader_lock_key = _derived(name, "leader", 8)
        self.migrate_lock_key = _derived(name, "migrate", 8)
        self.lock_classes = tuple(_derived(name, str(c), 4) for c in _LOCK_CLASSES)
        q = f'"{name}"'
        self._replacements = {
            "'awa_fast_cancel'": f"'{name}:cancel'",
            '"awa_fast_cancel"': f'"{name}:cancel"',
            "'awa_fast'": f"'{name}'",
            '"awa_fast"': q,
            "'awa_fast.": f"'{name}.",
            "awa_fast.": f"{q}.",
            "awa_fast": q,
            **{str(c): str(d) for c, d in zip(_LOCK_CLASSES, self.lock_classes, strict=True)},
        }
        self._pattern = re.compile(
            "'awa_fast_cancel'|\"awa_fast_cancel\"|'awa_fast'|\"awa_fast\"|'awa_fast\\."
            # a qualified name, or the bare schema name (not inside a word, not a literal's
            # text such as 'awa_fast: ...' or $awa_fast_migration$)
            "|(?<![\\w$'])awa_fast\\.|(?<![\\w$'\"])awa_fast(?![\\w$:])"
            "|" + "|".join(rf"\b{c}\b" for c in _LOCK_CLASSES)
        )

    def rewrite(self, text: str) -> str:
        """``text`` (a statement or a migration written for ``awa_fast``) for this schema: the
        same text for the default schema; otherwise rewritten by the module's rules, once per
        distinct text (a dict lookup after the first)."""
        if self.is_default:
            return text
        done = self._cache.get(text)
        if done is None:
            done = self._pattern.sub(lambda m: self._replacements[m.group(0)], text)
            if len(self._cache) < _CACHE_LIMIT:
                self._cache[text] = done
        return done

    def __repr__(self) -> str:
        return f"SchemaBinding({self.name!r})"


def bind(name: str = DEFAULT_SCHEMA, field: str = "schema") -> SchemaBinding:
    """The binding of schema ``name`` (one object per name, its cache shared).

    Raises:
        ValidationError: ``name`` breaks :func:`check_name`'s rule (naming ``field``).
    """
    return _bind(check_name(name, field))


@functools.cache
def _bind(name: str) -> SchemaBinding:
    return SchemaBinding(name)


DEFAULT = bind(DEFAULT_SCHEMA)


def resolve(name: str | None = None, field: str = "schema") -> SchemaBinding:
    """The binding a component given ``name`` uses: ``name``'s when given, else
    ``$AWA_FAST_SCHEMA``'s when set (the CLI's ``--schema`` sets it, so a launcher's children
    and the clients an application builds without ``schema=`` follow it), else the default
    ``awa_fast``.

    Raises:
        ValidationError: the name (or the variable's value) breaks :func:`check_name`'s rule.
    """
    import os

    if name is not None:
        return bind(name, field)
    env = os.environ.get(ENV)
    return bind(env, ENV) if env else DEFAULT
