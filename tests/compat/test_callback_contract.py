"""awa.callback_contract: BLAKE3 keyed-hash signatures (awa's pinned test vector), constant-time
verification, receiver URL building and the header/prefix constants."""

from __future__ import annotations

import pytest

from awa_fast import callback_contract as cc


def test_known_vector_and_roundtrip():
    secret = bytes([7] * 32)
    # awa's pinned vector: blake3::keyed_hash(&[7u8; 32], b"abc")
    assert (
        cc.sign(secret, "abc") == "b1495225f01fa8cd09e410d288d09b68c1cc9fb2414686c0d3ac13fc905497d9"
    )
    cid = "550e8400-e29b-41d4-a716-446655440000"
    sig = cc.sign(secret, cid)
    assert len(sig) == 64 and cc.verify(secret, cid, sig) is True
    assert cc.verify(secret, cid, sig.upper()) is True  # hex is case-insensitive


def test_verify_rejects():
    secret = bytes([7] * 32)
    sig = cc.sign(secret, "abc")
    assert cc.verify(bytes([8] * 32), "abc", sig) is False
    assert cc.verify(secret, "abd", sig) is False
    for bad in ("not-hex", "", sig[:-2], sig + "00"):
        assert cc.verify(secret, "abc", bad) is False


def test_secret_must_be_32_bytes():
    with pytest.raises(ValueError, match="32 bytes"):
        cc.sign(b"too short", "abc")
    with pytest.raises(ValueError, match="32 bytes"):
        cc.verify(b"\x00" * 16, "abc", "ff" * 32)


def test_urls_and_constants():
    assert cc.SIGNATURE_HEADER == "X-Awa-Signature"
    assert cc.DEFAULT_PATH_PREFIX == "/api/callbacks"
    assert cc.DEFAULT_HEARTBEAT_TIMEOUT_SECS == 3600.0
    assert (
        cc.build_callback_url("https://awa.example.com", cc.DEFAULT_PATH_PREFIX, "abc", "complete")
        == "https://awa.example.com/api/callbacks/abc/complete"
    )
    assert (
        cc.build_callback_url("https://x.example/", "/awa-cb/", "abc", "heartbeat")
        == "https://x.example/awa-cb/abc/heartbeat"
    )
    assert (
        cc.build_callback_url("https://x.example", "awa-cb", "abc", "fail")
        == "https://x.example/awa-cb/abc/fail"
    )
    assert (
        cc.build_callback_url("https://x.example", "   ", "abc", "complete")
        == "https://x.example/abc/complete"
    )
