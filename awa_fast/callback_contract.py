"""The HTTP callback-ingress contract of awa (``awa.callback_contract``): signing, verifying and
URL building for receivers of external callbacks hosted in your own web framework.

A signature is the lowercase hex BLAKE3 keyed hash of the callback id under a 32-byte secret,
sent in the ``X-Awa-Signature`` header; receiver URLs are ``{base}{prefix}/{callback_id}/{action}``
with ``action`` one of ``complete``, ``fail``, ``heartbeat``. Source of the rules: awa's
``awa_model::callback_contract`` (ADR-027).
"""

from __future__ import annotations

import hmac

import blake3

SIGNATURE_HEADER = "X-Awa-Signature"
DEFAULT_PATH_PREFIX = "/api/callbacks"
DEFAULT_HEARTBEAT_TIMEOUT_SECS = 3600.0

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT_SECS",
    "DEFAULT_PATH_PREFIX",
    "SIGNATURE_HEADER",
    "build_callback_url",
    "sign",
    "verify",
]


def _key(secret: bytes) -> bytes:
    if not isinstance(secret, (bytes, bytearray)) or len(secret) != 32:
        got = len(secret) if isinstance(secret, (bytes, bytearray)) else type(secret).__name__
        raise ValueError(f"callback secret must be exactly 32 bytes (got {got})")
    return bytes(secret)


def sign(secret: bytes, callback_id: str) -> str:
    """The signature of ``callback_id`` (str) under ``secret`` (32 bytes): 64 lowercase hex
    characters. Raises ValueError if the secret is not 32 bytes."""
    return blake3.blake3(callback_id.encode(), key=_key(secret)).hexdigest()


def verify(secret: bytes, callback_id: str, signature: str) -> bool:
    """True only if ``signature`` is the well-formed hex signature of ``callback_id`` (compared
    in constant time). Raises ValueError if the secret is not 32 bytes."""
    expected = sign(secret, callback_id)
    try:
        given = bytes.fromhex(signature)
    except (ValueError, TypeError):
        return False
    return len(given) == 32 and hmac.compare_digest(given, bytes.fromhex(expected))


def build_callback_url(base: str, prefix: str, callback_id: str, action: str) -> str:
    """``{base}{prefix}/{callback_id}/{action}``: trailing slashes of ``base`` and ``prefix`` are
    dropped, a ``prefix`` gets a leading ``/``, a blank ``prefix`` disappears."""
    prefix = prefix.strip().rstrip("/")
    if prefix and not prefix.startswith("/"):
        prefix = "/" + prefix
    return f"{base.rstrip('/')}{prefix}/{callback_id}/{action}"
