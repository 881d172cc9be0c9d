"""awa 0.7's storage options of ``start()`` (and ``enqueue_many_copy``) and what awa-fast does
with each: one table, :data:`OPTIONS`, read by the runtime, the producer and ``awa-fast check``.

awa 0.7 runs its queue-storage engine (rotating rings of ready, lease and claim partitions,
docs/configuration.md "Queue storage tuning" in awa's repository) and tunes it with these
keywords. awa-fast has one storage engine (the hot table and its finished slices, ADR 016).
Each option is either:

- ``honoured``: it has a counterpart here and is applied with awa's meaning and unit
  (``terminal_count_rollup_interval_ms``: awa-fast's counter fold, ``Maintenance.fold_counts``;
  ``queue_storage_schema``: the schema the client and its runtime use, ADR 027);
- ``inapplicable``: it tunes a mechanism awa-fast does not have. It is accepted with awa's own
  validation, logged once at INFO naming it and why it has no effect, and listed by
  ``awa-fast check``. Never silently: docs/compat.md has the table.

Per-queue ``claimers`` and ``retention`` are queue-dict keys, honoured by
``worker/config/queues.parse_queues`` (docs/compat.md).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from awa_fast.errors import ConfigError
from awa_fast.schema_binding import check_name

log = logging.getLogger("awa_fast.storage_options")

HONOURED = "honoured"
INAPPLICABLE = "inapplicable"

# awa 0.7's default queue-storage schema: ``queue_storage_schema`` equal to it (or omitted)
# is the client's own schema (``awa_fast`` unless the client was given another).
AWA_DEFAULT_SCHEMA = "awa"
TRANSITION_ROLES = ("auto", "canonical_drain", "queue_storage_target")

_NO_RING = (
    "awa-fast has no rotating ready/lease/claim partitions: live jobs are one hot table and "
    "finished jobs go to fixed-period slices (1 h completed, 3 h failed/cancelled) that expire "
    "by completed_retention_hours / failed_retention_hours"
)


@dataclasses.dataclass(frozen=True)
class StorageOption:
    """One awa ``start()`` keyword.

    Attributes:
        name: the keyword.
        kind: :data:`HONOURED` or :data:`INAPPLICABLE`.
        meaning: awa's documented meaning and unit.
        here: what awa-fast does with it (for an inapplicable option: why it has no effect).
        default: awa's default (``None``: not given).
        check: ``"positive_int"`` (awa: an unsigned int, ``> 0``), ``"schema"`` or ``"role"``.
    """

    name: str
    kind: str
    meaning: str
    here: str
    default: Any
    check: str = "positive_int"


OPTIONS: dict[str, StorageOption] = {
    o.name: o
    for o in (
        StorageOption(
            "terminal_count_rollup_interval_ms",
            HONOURED,
            "how often maintenance folds pending terminal-count deltas into compact counters "
            "(ms, > 0; awa default 30 s)",
            "the interval (ms) of the maintenance leader's counter fold of "
            "awa_fast.done_counts, run as its own loop; not given, the fold runs with each "
            "prune pass (cleanup_interval_ms)",
            None,
        ),
        StorageOption(
            "queue_storage_schema",
            HONOURED,
            "the schema of the queue-storage tables (default 'awa')",
            "the schema every awa-fast object of the client lives in: start() moves the client "
            "and its runtime there (migrate it first: install_queue_storage(schema=...) or "
            "awa-fast migrate --schema); awa's default 'awa' is the client's own schema",
            None,
            "schema",
        ),
        StorageOption(
            "queue_storage_queue_slot_count",
            INAPPLICABLE,
            "number of rotating ready/terminal queue partitions (default 16)",
            _NO_RING,
            16,
        ),
        StorageOption(
            "queue_storage_lease_slot_count",
            INAPPLICABLE,
            "number of rotating lease partitions (default 8)",
            _NO_RING,
            8,
        ),
        StorageOption(
            "queue_storage_claim_slot_count",
            INAPPLICABLE,
            "number of rotating claim-ring partitions (default 8)",
            _NO_RING,
            8,
        ),
        StorageOption(
            "queue_storage_queue_stripe_count",
            INAPPLICABLE,
            "physical stripes behind each logical queue (default 1; more weakens ordering)",
            "awa-fast has no stripes: every queue is one claim order by priority and run_at "
            "(the stricter contract awa's default 1 gives)",
            1,
        ),
        StorageOption(
            "queue_storage_queue_rotate_interval_ms",
            INAPPLICABLE,
            "how often ready/terminal segments rotate (ms, default 1000)",
            _NO_RING,
            1000,
        ),
        StorageOption(
            "queue_storage_lease_rotate_interval_ms",
            INAPPLICABLE,
            "how often lease segments rotate (ms, default 250)",
            _NO_RING,
            250,
        ),
        StorageOption(
            "queue_storage_claim_rotate_interval_ms",
            INAPPLICABLE,
            "how often the claim ring rotates (ms; default: the queue rotate interval)",
            _NO_RING,
            None,
        ),
        StorageOption(
            "storage_transition_role",
            INAPPLICABLE,
            "how this runtime takes part in a canonical -> queue-storage transition: 'auto', "
            "'canonical_drain' or 'queue_storage_target' (default 'auto')",
            "awa-fast has one storage engine and no transition: every role runs it",
            "auto",
            "role",
        ),
    )
}


def check_value(name: str, value: Any) -> None:
    """Validate ``value`` of option ``name`` as awa does (awa's messages: "X must be > 0").

    Raises:
        ConfigError: a non-int or an int < 1 for a count or interval; a
            ``storage_transition_role`` not among :data:`TRANSITION_ROLES`; a
            ``queue_storage_schema`` that is not a string.
        ValidationError: a ``queue_storage_schema`` that breaks the schema-name rule
            (``schema_binding.check_name``).
    """
    option = OPTIONS[name]
    if option.check == "positive_int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an int > 0, got {value!r}", field=name, limit="> 0")
        if value < 1:
            raise ConfigError(f"{name} must be > 0", field=name, limit="> 0")
    elif option.check == "role":
        if value not in TRANSITION_ROLES:
            raise ConfigError(
                "storage_transition_role must be one of 'auto', 'canonical_drain', or "
                f"'queue_storage_target' (got {value!r})",
                field=name,
                limit=" | ".join(TRANSITION_ROLES),
            )
    elif option.check == "schema":
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a str, got {value!r}", field=name, limit="str")
        if value != AWA_DEFAULT_SCHEMA:
            check_name(value, name)


def inapplicable_given(options: dict[str, Any]) -> list[StorageOption]:
    """The inapplicable options among ``options`` (keyword -> value) that are given (not
    ``None``), in table order."""
    return [
        o for name, o in OPTIONS.items() if o.kind == INAPPLICABLE and options.get(name) is not None
    ]


def accept(options: dict[str, Any], where: str = "start()") -> dict[str, Any]:
    """Validate every option of the table given in ``options`` (``None`` = not given), log
    one INFO line per inapplicable one given ("<name>=<value> has no effect in awa-fast:
    <why>"), and return the honoured ones given, by name.

    Raises:
        ConfigError, ValidationError: as :func:`check_value`, before anything is logged.
    """
    given = {k: v for k, v in options.items() if k in OPTIONS and v is not None}
    for name, value in given.items():
        check_value(name, value)
    for option in inapplicable_given(given):
        log.info(
            "%s: %s=%r has no effect in awa-fast: %s",
            where,
            option.name,
            given[option.name],
            option.here,
        )
    return {k: v for k, v in given.items() if OPTIONS[k].kind == HONOURED}
