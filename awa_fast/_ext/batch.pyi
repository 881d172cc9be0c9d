# Types of the compiled batch module (source: _ext/batch.pyx).
def encode_many(objs: list[object], field: str) -> list[bytes]: ...
def keys_many(
    kind: str, queue: str, jsons: list[bytes], by_queue: bool, by_args: bool, by_period: int | None
) -> list[bytes]: ...
def copy_block(
    ids: list[int],
    jsons: list[bytes],
    keys: list[bytes] | None,
    head: bytes,
    mid: bytes,
    tail: bytes,
) -> bytes: ...
