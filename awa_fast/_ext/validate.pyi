# Types of the compiled validate module (source: _ext/validate.pyx).
from datetime import datetime

NUL_LIMIT: str
RUN_AT_TYPES_LIMIT: str
RUN_AT_FORMAT_LIMIT: str
RUN_AT_RANGE_LIMIT: str

# The validators take any value: a wrong type is one of the errors they report.
def validate_insert(
    kind: object, queue: object, priority: object, max_attempts: object, tags: object
) -> list[str]: ...
def check_json_nul(data: bytes, field: str) -> None: ...
def normalize_run_at(value: object) -> datetime | None: ...
def derive_kind(name: str) -> str: ...
