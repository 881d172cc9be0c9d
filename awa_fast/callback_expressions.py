"""awa's CEL callback expressions (ADR-021): compiled at registration, evaluated by
``resolve_callback``.

A callback may carry up to four expressions over one variable, ``payload`` (the JSON payload
given to ``resolve_callback``): ``filter`` (bool: process this payload at all?), ``on_fail``
(bool: the payload means failure; evaluated before ``on_complete``), ``on_complete`` (bool: the
payload means success) and ``transform`` (any value: the payload returned on completion).
Evaluation follows awa (``awa-model/src/admin.rs`` ``evaluate_cel``): filter false ignores the
payload; an expression that errors or yields a non-bool is *fail-open* (filter passes, on_fail
and on_complete do not match) and is logged; a failing transform returns the payload unchanged;
when nothing matches, ``default_action`` applies. CEL itself is the maintained ``cel-python``
implementation (``celpy``), imported on first use so that callbacks without expressions cost
nothing.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from typing import Any

from awa_fast.errors import ValidationError

log = logging.getLogger("awa_fast.callbacks")

FIELDS = ("filter", "on_complete", "on_fail", "transform")
# Names an expression may use besides ``payload``: CEL's type identifiers (``type(x) == int``).
_TYPE_NAMES = frozenset(
    (
        "int",
        "uint",
        "double",
        "bool",
        "string",
        "bytes",
        "list",
        "map",
        "null_type",
        "type",
        "duration",
        "timestamp",
    )
)
# CEL macros whose first argument binds a variable (``payload.items.all(v, v > 0)``).
_BINDING_MACROS = frozenset(("all", "exists", "exists_one", "map", "filter"))

# awa's texts (awa-model admin.rs).
DEFAULT_FAIL_ERROR = "callback failed: default action"
DEFAULT_IGNORE_REASON = "no expressions configured, default is ignore"
FILTER_IGNORE_REASON = "filter expression returned false"
ON_FAIL_ERROR = "callback failed: on_fail expression matched"


def _celpy():
    import celpy  # cel-python; deferred: only callbacks with expressions need it

    return celpy


@lru_cache(maxsize=1024)
def _program(source: str):
    """The compiled program of ``source`` (compiled once per process, then cached)."""
    celpy = _celpy()
    env = celpy.Environment()
    return env.program(env.compile(source))


def _free_names(tree) -> set[str]:
    """Identifiers used in a celpy parse tree, less the ones a macro binds."""
    from lark import Token, Tree

    used: set[str] = set()
    bound: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data == "ident":
            used.update(str(c) for c in node.children if isinstance(c, Token))
        elif node.data == "member_dot_arg" and len(node.children) >= 3:
            method, args = node.children[1], node.children[2]
            if str(method) in _BINDING_MACROS and isinstance(args, Tree) and args.children:
                first = args.children[0]
                names = [n for n in first.iter_subtrees() if n.data == "ident"]
                if len(names) == 1:
                    bound.update(str(c) for c in names[0].children if isinstance(c, Token))
    return used - bound - _TYPE_NAMES


def compile_expressions(
    filter: Any = None, on_complete: Any = None, on_fail: Any = None, transform: Any = None
) -> dict[str, str] | None:
    """Check the expressions given to ``register_callback``; returns them as a dict (the
    stored form; fields that are ``None`` left out) or ``None`` when none is given.

    Raises:
        ValidationError: ``field`` names the expression that is not a string, does not
            compile as CEL (awa's "invalid CEL expression for <field>") or uses a variable
            other than ``payload`` (awa rejects these at registration too: CEL would only
            report them at resolve time, where they would silently fail open).
    """
    given = {
        "filter": filter,
        "on_complete": on_complete,
        "on_fail": on_fail,
        "transform": transform,
    }
    out: dict[str, str] = {}
    for name, source in given.items():
        if source is None:
            continue
        if not isinstance(source, str):
            raise ValidationError(
                f"{name} must be a CEL expression string, got {type(source).__name__}",
                field=name,
                limit="str",
            )
        celpy = _celpy()
        try:
            tree = celpy.Environment().compile(source)
        except celpy.CELParseError as exc:
            raise ValidationError(
                f"invalid CEL expression for {name}: {exc}", field=name, limit="CEL"
            ) from None
        bad = sorted(_free_names(tree) - {"payload"})
        if bad:
            raise ValidationError(
                f"CEL expression for {name} references undeclared variable(s): "
                f"{', '.join(bad)}; only 'payload' is available",
                field=name,
                limit="payload",
            )
        out[name] = source
    return out or None


def _evaluate(source: str, payload: Any, job_id: int, name: str) -> tuple[bool, Any]:
    """``(ok, value)``; ``ok`` is False (and the error logged) when the expression fails."""
    celpy = _celpy()
    try:
        value = _program(source).evaluate({"payload": celpy.json_to_cel(payload)})
    except Exception as exc:  # CELEvalError, CELParseError or a type error inside celpy
        value = exc
    if isinstance(value, Exception):
        log.warning(
            "CEL %s of job %s failed: %s",
            name,
            job_id,
            value,
            extra={"job_id": job_id, "expression_name": name, "expression": source},
        )
        return False, None
    return True, value


def _bool(source: str, payload: Any, job_id: int, name: str) -> bool | None:
    """The expression's bool, or ``None`` (fail-open) for an error or a non-bool result."""
    ok, value = _evaluate(source, payload, job_id, name)
    if not ok:
        return None
    if not isinstance(value, _celpy().celtypes.BoolType):
        log.warning(
            "CEL %s of job %s returned %s, not a bool",
            name,
            job_id,
            type(value).__name__,
            extra={"job_id": job_id, "expression_name": name},
        )
        return None
    return bool(value)


def _to_json(value: Any) -> Any:
    from celpy.adapter import CELJSONEncoder

    return json.loads(json.dumps(value, cls=CELJSONEncoder))


class Decision:
    """What ``resolve_callback`` does: ``action`` is ``"complete"`` (with ``payload``),
    ``"fail"`` (with ``error`` and the matching ``expression``, if any) or ``"ignore"``
    (with ``reason``)."""

    __slots__ = ("action", "payload", "error", "expression", "reason")

    def __init__(
        self,
        action: str,
        payload: Any = None,
        error: str | None = None,
        expression: str | None = None,
        reason: str | None = None,
    ):
        self.action, self.payload, self.error = action, payload, error
        self.expression, self.reason = expression, reason


def _default(default_action: str, payload: Any) -> Decision:
    if default_action == "complete":
        return Decision("complete", payload=payload)
    if default_action == "fail":
        return Decision("fail", error=DEFAULT_FAIL_ERROR)
    return Decision("ignore", reason=DEFAULT_IGNORE_REASON)


def decide(expressions: dict | None, payload: Any, default_action: str, job_id: int) -> Decision:
    """Evaluate a callback's stored ``expressions`` against ``payload`` in awa's order:
    filter, on_fail, on_complete (+ transform), then ``default_action``."""
    if not expressions:
        return _default(default_action, payload)
    source = expressions.get("filter")
    if source is not None and _bool(source, payload, job_id, "filter") is False:
        return Decision("ignore", reason=FILTER_IGNORE_REASON)
    source = expressions.get("on_fail")
    if source is not None and _bool(source, payload, job_id, "on_fail"):
        return Decision("fail", error=ON_FAIL_ERROR, expression=source)
    source = expressions.get("on_complete")
    if source is not None and _bool(source, payload, job_id, "on_complete"):
        transform = expressions.get("transform")
        if transform is None:
            return Decision("complete", payload=payload)
        ok, value = _evaluate(transform, payload, job_id, "transform")
        return Decision("complete", payload=_to_json(value) if ok else payload)
    return _default(default_action, payload)
