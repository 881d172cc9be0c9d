"""Insert requests: args -> JSON, kind derivation, option structs and the validated row.

Every producer path (``insert``, ``insert_many``, COPY, transactions, the bridge) and staging of
follow-ups (ADR-046) goes through :func:`prepare`, so they share one set of rules. Validation and
unique-key hashing run in the compiled ``_ext`` modules before anything touches the database.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import math
from datetime import datetime
from typing import Any

import msgspec
import orjson

from awa_fast import _native, telemetry
from awa_fast.errors import SerializationError, ValidationError
from awa_fast.typed_args import check_round_trip, needs_check

_SORT = orjson.OPT_SORT_KEYS
DEFAULT_UNIQUE_STATES = 31

# The size bounds of one job, in bytes of what is sent and stored: the canonical JSON of args
# and metadata, the UTF-8 of all tags together, the ordering key's bytes. awa-pg has no such
# bound (PostgreSQL's is 255 MiB per JSON string, 1 GiB per value): a job this large is refused
# before anything is sent, instead of failing in the server after seconds of work, or being
# read back whole by every claim, page and dump of it (ADR 025).
MAX_ARGS_BYTES = 1 << 20  # 1 MiB
MAX_METADATA_BYTES = 1 << 16  # 64 KiB
MAX_TAGS_BYTES = 1 << 16
MAX_ORDERING_KEY_BYTES = 1 << 16
# A payload resume_external hands a waiting handler: its input, as args are.
MAX_PAYLOAD_BYTES = MAX_ARGS_BYTES
# What one insert_many statement may carry (the sum of its jobs' Prepared.size): the server
# takes at most 1 GiB per message and closes the connection past it; COPY streams, unbounded.
MAX_STATEMENT_BYTES = 1 << 28  # 256 MiB


class UniqueOpts(msgspec.Struct, frozen=True, kw_only=True):
    """Unique-job options (awa's defaults). ``states`` is the bitmask of states that hold the key:
    bit 0 scheduled, 1 available, 2 running, 3 completed, 4 retryable, 5 failed, 6 cancelled,
    7 waiting_external. ``by_period`` is the bucket number itself (e.g. ``int(time.time()) // 3600``).
    """

    by_queue: bool = False
    by_args: bool = True
    by_period: int | None = None
    states: int = DEFAULT_UNIQUE_STATES

    def as_dict(self) -> dict:
        return msgspec.structs.asdict(self)


class InsertOpts(msgspec.Struct, frozen=True, kw_only=True):
    """The keyword options of an insert, as one value (awa-pg's defaults)."""

    kind: str | None = None
    queue: str = "default"
    priority: int = 2
    max_attempts: int = 25
    tags: list[str] | None = None
    metadata: dict | None = None
    run_at: datetime | str | None = None
    unique_opts: dict | UniqueOpts | None = None
    ordering_key: bytes | str | None = None


def _too_large(field: str, size: int, limit: int, where: str = "") -> ValidationError:
    return ValidationError(
        f"{field} is {size:,} bytes{where}, over the limit of {limit:,} bytes "
        f"(awa_fast.requests.MAX_{field.upper()}_BYTES)",
        field=field,
        limit=f"<= {limit} bytes",
        size=size,
    )


def check_size(field: str, size: int, limit: int) -> None:
    """Raise :class:`ValidationError` (``field``, ``size``, ``limit`` as ``"<= N bytes"``)
    when ``size`` bytes of ``field`` exceed ``limit``."""
    if size > limit:
        raise _too_large(field, size, limit)


def _tags_bytes(tags: list[str]) -> int:
    n = 0
    for tag in tags:
        n += len(tag)
    if 4 * n <= MAX_TAGS_BYTES:  # UTF-8 takes at most 4 bytes a character
        return n
    return sum(len(tag.encode()) for tag in tags)


def check_statement_size(rows: list[Prepared], alternative: str) -> None:
    """Raise :class:`ValidationError` (field ``jobs``) when the jobs of one statement take
    more than ``MAX_STATEMENT_BYTES`` together; ``alternative`` says what to do instead."""
    total = sum(p.size for p in rows)
    if total > MAX_STATEMENT_BYTES:
        raise ValidationError(
            f"jobs: {len(rows):,} jobs of {total:,} bytes together, over the limit of "
            f"{MAX_STATEMENT_BYTES:,} bytes for one statement "
            f"(awa_fast.requests.MAX_STATEMENT_BYTES); {alternative}",
            field="jobs",
            limit=f"<= {MAX_STATEMENT_BYTES} bytes",
            size=total,
        )


class Prepared(msgspec.Struct, array_like=True, gc=False):
    """One validated row ready to insert. ``args``/``metadata`` are JSON text; ``size`` is bytes
    (kind + queue + args + metadata + tags + ordering key, UTF-8), the ADR-046 size measure."""

    kind: str
    queue: str
    args: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    metadata: str
    tags: list[str]
    unique_key: bytes | None
    unique_states: int | None
    ordering_key: bytes | None
    size: int


_kind_cache: dict[type, str] = {}


def derive_kind(name: str) -> str:
    """CamelCase -> snake_case as awa derives kinds (``"SMTPEmail"`` -> ``"smtp_email"``)."""
    return _native.derive_kind(name)


def check_name(value: Any, field: str) -> str:
    """``value`` as a job kind or queue name: a ``str`` of 1..200 characters without NUL (the
    one rule of every name, checked in ``_ext``; :func:`awa_fast._native.check_name`).

    Raises:
        ValidationError: ``field`` names the argument, ``limit`` the rule.
    """
    return _native.check_name(value, field)


def optional_name(value: Any, field: str) -> str | None:
    """``None`` (no filter), else :func:`check_name`."""
    return None if value is None else _native.check_name(value, field)


def kind_for_type(args_type: type) -> str:
    """The default kind of an args type: ``derive_kind(args_type.__name__)`` (cached)."""
    kind = _kind_cache.get(args_type)
    if kind is None:
        kind = _kind_cache[args_type] = derive_kind(args_type.__name__)
    return kind


def args_to_builtins(args: Any) -> dict:
    """Convert job args to a JSON-compatible dict.

    Accepts a ``dict``, a dataclass instance, a ``msgspec.Struct`` or an object with
    ``model_dump`` (pydantic). Raises :class:`ValidationError` (field ``args``) for anything else,
    and (field ``args.<name>``) for a dataclass/Struct value that would reach the handler
    changed (``awa_fast/typed_args.py``).
    """
    if type(args) is dict:
        return args
    try:
        if isinstance(args, msgspec.Struct) or (
            dataclasses.is_dataclass(args) and not isinstance(args, type)
        ):
            # deterministic: a set's elements in sorted order (stable JSON and unique keys);
            # only types with non-plain fields can hold a set (and pay for sorting)
            check = needs_check(type(args))
            out = (
                msgspec.to_builtins(args, order="deterministic")
                if check
                else msgspec.to_builtins(args)
            )
        else:
            out = None
        dump = None if out is not None else getattr(args, "model_dump", None)
        if dump is not None:
            return dump(mode="json")
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"args are not JSON-serializable: {exc}", field="args", limit="JSON"
        ) from exc
    if out is not None:
        if check:
            check_round_trip(args, out)
        return out
    if isinstance(args, dict):
        return dict(args)
    raise ValidationError(
        f"args must be a dict, dataclass, msgspec.Struct or pydantic model, got {type(args).__name__}",
        field="args",
        limit="dict | dataclass | msgspec.Struct | model_dump()",
    )


def to_json(value: Any, field: str, *, exact: bool = False) -> bytes:
    """Canonical JSON (sorted keys, compact, UTF-8) of ``value``; no NUL character at any depth.

    ``exact`` (untyped args and metadata: what the handler gets back is the stored JSON, with no
    type to decode it into): ``value`` must come back from the JSON equal, so it may hold only
    JSON values -- ``None``, ``bool``, ``int`` (64 bits), finite ``float``, ``str``, ``list``
    and ``dict`` with ``str`` keys (subclasses such as a ``str`` enum come back as their base
    type, equal). orjson would write a ``datetime``, ``date``, ``time``, ``UUID``, ``tuple``,
    ``Enum`` or dataclass as a string, list, value or dict, so the handler would see another
    type than was inserted; awa-pg refuses tuples, datetimes and sets (``TypeError``), and
    neither writes a ``Decimal`` exactly. ADR 030.

    Raises:
        SerializationError: ``value`` does not serialize (a ``Decimal``, ``set``, ``bytes``,
            a non-str key, an int beyond 64 bits, ...), naming its path when it can be found.
        ValidationError: the JSON would contain a NUL character, or ``value`` holds a NaN or
            infinite float (JSON has none; orjson writes ``null``, which would reach the
            handler as ``None`` and share a unique key with it), or (``exact``) a value that
            would not come back equal, naming its path (``args.value``, ``metadata.m[2]``).
    """
    try:
        data = orjson.dumps(value, option=_SORT)
    except TypeError as exc:
        found = _first_inexact(value, field, unencodable=True)
        where = field if found is None else found[0]
        raise SerializationError(
            f"{where} is not JSON-serializable: {exc}", field=where, limit="JSON"
        ) from exc
    _native.check_json_nul(data, field)
    _check_finite(data, value, field)
    if exact and orjson.loads(data) != value:
        _refuse_inexact(value, field)
    return data


def check_exact_many(jsons: list, values: list, field: str) -> None:
    """:func:`to_json`'s ``exact`` check for many rows at once (``jsons[i]`` encodes
    ``values[i]``; one parse of them all). Raises as :func:`to_json`."""
    if jsons and orjson.loads(b"[" + b",".join(jsons) + b"]") != values:
        for i, value in enumerate(values):
            if orjson.loads(jsons[i]) != value:
                _refuse_inexact(value, f"{field}[{i}]")


_JSON_LEAVES = (str, bool, type(None))


def _first_inexact(value: Any, path: str, *, unencodable: bool = False) -> tuple[str, Any] | None:
    """``(path, value)`` of the first value in ``value`` that is not a JSON value (see
    :func:`to_json`), depth first; ``None`` if there is none. ``unencodable``: only a value
    orjson cannot write at all counts (the cause of its ``TypeError``); tuples are walked."""
    if isinstance(value, _JSON_LEAVES):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else (path, value)
    if isinstance(value, float):
        return None if unencodable or math.isfinite(value) else (path, value)
    if isinstance(value, list) or (unencodable and isinstance(value, tuple)):
        for i, item in enumerate(value):
            found = _first_inexact(item, f"{path}[{i}]", unencodable=unencodable)
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"{path} key {key!r}", key)
            found = _first_inexact(item, f"{path}.{key}", unencodable=unencodable)
            if found is not None:
                return found
        return None
    if unencodable:
        try:
            orjson.dumps(value)
        except TypeError:
            return (path, value)
        return None
    return (path, value)


def _refuse_inexact(value: Any, field: str) -> None:
    found = _first_inexact(value, field)
    where, bad = found if found is not None else (field, value)
    shown = repr(bad)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise ValidationError(
        f"{where}: {type(bad).__name__} {shown} would not reach the handler as it was "
        "inserted (untyped args and metadata hold JSON values only: None, bool, int, float, "
        "str, list, dict with str keys); convert it (e.g. .isoformat(), str(), list()) or "
        "declare a typed args class",
        field=where,
        limit="a JSON value",
    )


def _check_finite(data: bytes, value: Any, path: str) -> None:
    """Raise ``ValidationError`` naming the path of the first NaN or infinite float in
    ``value``, whose orjson encoding is ``data`` (orjson writes them as ``null``: only JSON
    holding one is walked). Walks dicts, lists, tuples, dataclasses and enum members, as orjson
    writes them; the path is built only once one is found."""
    if b"null" not in data or not _has_non_finite(value):
        return
    for where, bad in _floats(value, path):
        if not math.isfinite(bad):
            raise ValidationError(
                f"{where} is {bad!r}: JSON has no NaN or infinity (it would be stored as null)",
                field=where,
                limit="a finite number",
            )


def _children(value: Any) -> Any:
    """``(name, child)`` pairs of a container orjson serializes, or None for a leaf."""
    if isinstance(value, dict):
        return ((f".{k}", v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ((f"[{i}]", v) for i, v in enumerate(value))
    if isinstance(value, enum.Enum):
        return (("", value.value),)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    return None


def _has_non_finite(value: Any) -> bool:
    # The stdlib's C encoder refuses NaN and infinities with allow_nan=False: a C-speed walk
    # (a million None in about 30 ms). What it cannot encode it asks _leaf for.
    try:
        json.dumps(value, allow_nan=False, default=_leaf, check_circular=False)
    except ValueError:
        return True
    return False


def _leaf(value: Any) -> Any:
    """``json.dumps``'s fallback: the children orjson would write, else nothing to check."""
    children = _children(value)
    return None if children is None else [child for _, child in children]


def _floats(value: Any, path: str) -> Any:
    """``(path, float)`` of every float in ``value``, depth first (for the error's path)."""
    if isinstance(value, float):
        yield path, float(value)
        return
    children = _children(value)
    if children is not None:
        for name, child in children:
            yield from _floats(child, path + name)


def _ordering_key(value: bytes | str | None) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise ValidationError(
                "ordering_key must be valid Unicode (no lone surrogates)",
                field="ordering_key",
                limit="valid UTF-8",
            ) from None
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise ValidationError(
        "ordering_key must be bytes, str or None", field="ordering_key", limit="bytes | str"
    )


def _unique_tuple(unique_opts: Any) -> tuple | None:
    if isinstance(unique_opts, UniqueOpts):
        unique_opts = unique_opts.as_dict()
    return _native.parse_unique_opts(unique_opts)


def _shared_options(
    kind: str,
    queue: str,
    priority: int,
    max_attempts: int,
    tags: Any,
    metadata: Any,
    run_at: Any,
    unique_opts: Any,
    ordering_key: Any,
) -> tuple[list[str], bytes, datetime | None, bytes | None, tuple | None]:
    """Validate everything but the args: ``(tags, metadata_json, run_at, ordering_key,
    unique tuple or None)``. Raises ValidationError."""
    tags = _native.validate_insert(kind, queue, priority, max_attempts, tags)
    if tags:
        check_size("tags", _tags_bytes(tags), MAX_TAGS_BYTES)
    metadata = telemetry.inject(metadata)  # the producer's trace context (awa:traceparent)
    if metadata is None:
        meta_json = b"{}"
    elif isinstance(metadata, dict):
        meta_json = to_json(metadata, "metadata", exact=True)
        check_size("metadata", len(meta_json), MAX_METADATA_BYTES)
    else:
        raise ValidationError("metadata must be a dict or None", field="metadata", limit="dict")
    okey = _ordering_key(ordering_key)
    if okey is not None:
        check_size("ordering_key", len(okey), MAX_ORDERING_KEY_BYTES)
    return (
        tags,
        meta_json,
        _native.normalize_run_at(run_at),
        okey,
        _unique_tuple(unique_opts),
    )


def prepare(
    args: Any,
    *,
    kind: str | None = None,
    queue: str = "default",
    priority: int = 2,
    max_attempts: int = 25,
    tags: list[str] | None = None,
    metadata: dict | None = None,
    run_at: datetime | str | None = None,
    unique_opts: dict | UniqueOpts | None = None,
    ordering_key: bytes | str | None = None,
) -> Prepared:
    """Validate one insert request and compute its unique key.

    Rules (checked in ``_ext``): priority 1-4, max_attempts 1-1000, kind and queue 1-200
    characters, at most 20 tags, no NUL character in kind, queue, tags, args or metadata (any
    depth), run_at within years 1-9999, args/metadata JSON-serializable. Sizes, in bytes of
    what is stored: args at most ``MAX_ARGS_BYTES`` (1 MiB of JSON), metadata
    ``MAX_METADATA_BYTES`` (64 KiB of JSON), all tags together ``MAX_TAGS_BYTES`` (64 KiB of
    UTF-8), the ordering key ``MAX_ORDERING_KEY_BYTES`` (64 KiB).

    Raises:
        ValidationError: a rule is broken; ``.field`` names the field and ``.limit`` the rule
            (a size rule also gives ``.size``, the bytes found).
    """
    if kind is None:
        if isinstance(args, dict):
            raise ValidationError(
                "kind is required when args is a dict", field="kind", limit="required"
            )
        kind = kind_for_type(type(args))
    tags, meta_json, run_at, okey, unique = _shared_options(
        kind, queue, priority, max_attempts, tags, metadata, run_at, unique_opts, ordering_key
    )
    args_json = to_json(args_to_builtins(args), "args", exact=isinstance(args, dict))
    check_size("args", len(args_json), MAX_ARGS_BYTES)
    if unique is None:
        ukey = ustates = None
    else:
        by_queue, by_args, by_period, ustates = unique
        ukey = _native.unique_key(kind, queue, args_json, by_queue, by_args, by_period)
    size = _native.request_size(kind, queue, args_json, meta_json, tags, okey)
    return Prepared(
        kind,
        queue,
        args_json.decode(),
        priority,
        max_attempts,
        run_at,
        meta_json.decode(),
        tags,
        ukey,
        ustates,
        okey,
        size,
    )


class UniformBatch(msgspec.Struct, gc=False):
    """Many args of one type with shared options, validated once (see :func:`prepare_uniform`).
    ``args`` holds the JSON-compatible dicts, ``jsons`` their canonical JSON, ``keys`` the unique
    keys (or ``None``)."""

    kind: str
    queue: str
    priority: int
    max_attempts: int
    tags: list[str]
    metadata: bytes
    run_at: datetime | None
    unique_states: int | None
    ordering_key: bytes | None
    args: list
    jsons: list
    keys: list | None


def prepare_uniform(
    items: list,
    *,
    kind: str | None = None,
    queue: str = "default",
    priority: int = 2,
    max_attempts: int = 25,
    tags: list[str] | None = None,
    metadata: dict | None = None,
    run_at: datetime | str | None = None,
    unique_opts: dict | UniqueOpts | None = None,
    ordering_key: bytes | str | None = None,
) -> UniformBatch | None:
    """Validate a bulk insert whose elements are all args of one type, sharing one set of
    options: the options once, the per-row loops (JSON, NUL scan, unique keys) in ``_ext``.

    Returns ``None`` when the batch is not uniform (mixed types or ``EnqueueRequest`` items);
    the caller then prepares row by row. Raises as :func:`prepare`.
    """
    if not items:
        return None
    first = type(items[0])
    if first is EnqueueRequest or any(type(x) is not first for x in items):
        return None
    if kind is None:
        if issubclass(first, dict):
            raise ValidationError(
                "kind is required when args is a dict", field="kind", limit="required"
            )
        kind = kind_for_type(first)
    tags, meta_json, run_at, okey, unique = _shared_options(
        kind, queue, priority, max_attempts, tags, metadata, run_at, unique_opts, ordering_key
    )
    builtins = _uniform_builtins(items, first)
    jsons = _uniform_jsons(builtins)
    if issubclass(first, dict):
        check_exact_many(jsons, builtins, "args")
    keys = None
    if unique is not None:
        by_queue, by_args, by_period, _ = unique
        keys = _native.keys_many(kind, queue, jsons, by_queue, by_args, by_period)
    return UniformBatch(
        kind,
        queue,
        priority,
        max_attempts,
        tags,
        meta_json,
        run_at,
        None if unique is None else unique[3],
        okey,
        builtins,
        jsons,
        keys,
    )


def _uniform_builtins(items: list, first: type) -> list:
    """The JSON-ready builtins of a uniform batch's args (one C call for structs and
    dataclasses).

    Raises:
        SerializationError: an arg is not JSON-serializable or does not round-trip.
    """
    if first is dict:
        return items
    if not (issubclass(first, msgspec.Struct) or dataclasses.is_dataclass(first)):
        return [args_to_builtins(x) for x in items]
    try:
        builtins = msgspec.to_builtins(items, order="deterministic" if needs_check(first) else None)
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"args are not JSON-serializable: {exc}", field="args", limit="JSON"
        ) from exc
    if needs_check(first):
        for item, out in zip(items, builtins):
            check_round_trip(item, out)
    return builtins


def _uniform_jsons(builtins: list) -> list[bytes]:
    """Each row's args as JSON, sized and checked (ADR 025: 1 MiB of args at most).

    Raises:
        SerializationError: a value cannot be encoded (named by its path in the row).
        ValidationError: a row's args pass MAX_ARGS_BYTES.
    """
    try:
        jsons = _native.encode_many(builtins, "args")
    except SerializationError as exc:  # name the value in the row (field "args[i]")
        row = exc.field or ""
        found = None
        if row.startswith("args[") and row.endswith("]"):
            found = _first_inexact(builtins[int(row[5:-1])], row, unencodable=True)
        if found is None:
            raise
        raise SerializationError(
            f"{found[0]} is not JSON-serializable: {exc}", field=found[0], limit="JSON"
        ) from exc
    if max(map(len, jsons)) > MAX_ARGS_BYTES:
        i, data = next((i, d) for i, d in enumerate(jsons) if len(d) > MAX_ARGS_BYTES)
        raise _too_large("args", len(data), MAX_ARGS_BYTES, f" (jobs[{i}])")
    for i, data in enumerate(jsons):
        if b"null" in data:  # (the hot loop skips the call for rows without one)
            _check_finite(data, builtins[i], f"args[{i}]")
    return jsons


class EnqueueRequest:
    """A job to insert, as a value: ``EnqueueRequest(args, kind=..., queue=..., ...)`` with the
    same keywords and defaults as ``insert``. Used for staged follow-ups (ADR-046) and as the
    return value of registered follow-up specs (ADR-029).

    ``.unique(opts)`` and ``.metadata(dict)`` return a copy with that option changed and every
    other option kept (ADR-046: ``with_opts`` silently dropped earlier options).
    """

    __slots__ = ("args", "options")

    def __init__(self, args: Any, **options: Any):
        unknown = set(options) - set(InsertOpts.__struct_fields__)
        if unknown:
            raise ValidationError(
                f"unknown EnqueueRequest option(s): {', '.join(sorted(unknown))}",
                field=sorted(unknown)[0],
                limit=", ".join(InsertOpts.__struct_fields__),
            )
        self.args = args
        self.options = options

    def _with(self, **change: Any) -> EnqueueRequest:
        return EnqueueRequest(self.args, **{**copy.copy(self.options), **change})

    def unique(self, opts: dict | UniqueOpts | None = None) -> EnqueueRequest:
        """A copy with ``unique_opts`` set (``None`` or ``{}`` = the default unique options)."""
        return self._with(unique_opts={} if opts is None else opts)

    def metadata(self, metadata: dict) -> EnqueueRequest:
        """A copy with ``metadata`` set."""
        return self._with(metadata=metadata)

    def with_options(self, **options: Any) -> EnqueueRequest:
        """A copy with the given insert options changed."""
        return self._with(**options)

    def prepare(self) -> Prepared:
        """Validate this request (see :func:`prepare`)."""
        return prepare(self.args, **self.options)

    def __repr__(self) -> str:
        return f"EnqueueRequest({type(self.args).__name__}, {self.options!r})"
