# Types of the compiled unique module (source: _ext/unique.pyx).
DEFAULT_STATES: int
STATE_BITS: dict[str, int]

def parse_unique_opts(opts: object) -> tuple[bool, bool, int | None, int] | None: ...
def unique_key(
    kind: str,
    queue: str,
    args_json: bytes | None,
    by_queue: bool,
    by_args: bool,
    by_period: int | None,
) -> bytes: ...
