"""awa's queue and job-kind descriptors: what a queue or kind is for (display name, description,
owner, docs URL, tags, extra JSON), declared in code with ``AsyncClient.queue_descriptor`` /
``job_kind_descriptor`` before ``start()``, upserted into ``awa_fast.queue_descriptors`` /
``job_kind_descriptors`` at start and refreshed (``last_seen_at``) on every presence beat of the
runtime; the maintenance leader deletes rows no runtime has refreshed for
``descriptor_retention_days`` (awa's default 30; 0 keeps them). ``descriptor_hash`` (BLAKE3 of
the canonical fields) tells whether a declaration changed; ``updated_at`` moves only then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypedDict

import blake3
import orjson

from awa_fast.errors import ValidationError
from awa_fast.repo.descriptors import DescriptorRepo
from awa_fast.requests import check_name, to_json

# awa's limits (v009 descriptor tables), characters.
_LIMITS = {"display_name": 200, "description": 2000, "owner": 200, "docs_url": 2048}
MAX_TAGS = 20


@dataclasses.dataclass(frozen=True)
class Descriptor:
    display_name: str | None
    description: str | None
    owner: str | None
    docs_url: str | None
    tags: tuple[str, ...]
    extra: str  # canonical JSON text

    @property
    def hash(self) -> str:
        fields = dataclasses.asdict(self)
        fields["extra"] = orjson.loads(self.extra)
        return blake3.blake3(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def params(self, name: str) -> dict:
        return {
            "name": name,
            "display_name": self.display_name,
            "description": self.description,
            "owner": self.owner,
            "docs_url": self.docs_url,
            "tags": list(self.tags),
            "extra": self.extra,
            "hash": self.hash,
        }


class DescriptorFields(TypedDict, total=False):
    """The fields of a queue or job-kind descriptor, as ``AsyncClient.queue_descriptor`` /
    ``job_kind_descriptor`` take them (each ``None`` by default; limits in :func:`build`)."""

    display_name: str | None
    description: str | None
    owner: str | None
    docs_url: str | None
    tags: list[str] | None
    extra: dict | None


def check_fields(method: str, fields: Mapping[str, Any]) -> None:
    """``fields``, the keywords the client's ``method`` (``queue_descriptor``, ...) was called
    with, are descriptor fields.

    Raises:
        TypeError: one is not (naming ``method``, as Python does for an unknown keyword).
    """
    for key in fields:
        if key not in DescriptorFields.__annotations__:
            raise TypeError(f"{method}() got an unexpected keyword argument {key!r}")


def build(
    what: str,
    name: Any,
    *,
    display_name: Any = None,
    description: Any = None,
    owner: Any = None,
    docs_url: Any = None,
    tags: Any = None,
    extra: Any = None,
) -> Descriptor:
    """Validate one declaration; ``what`` is ``"queue"`` or ``"kind"`` (the name's field).

    Raises:
        ValidationError: ``field`` names the argument: a name that breaks the name rule
            (``requests.check_name``: 1-200 characters, no NUL),
            a text field that is not a str or is past awa's limit (display_name and owner 200,
            description 2000, docs_url 2048 characters), more than 20 tags or a non-str tag,
            ``extra`` not a JSON-serializable dict.
    """
    check_name(name, what)
    texts = {
        "display_name": display_name,
        "description": description,
        "owner": owner,
        "docs_url": docs_url,
    }
    for field, value in texts.items():
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValidationError(
                f"{field} must be a str, got {type(value).__name__}", field=field, limit="str"
            )
        if len(value) > _LIMITS[field]:
            raise ValidationError(
                f"{field} is {len(value)} characters; at most {_LIMITS[field]}",
                field=field,
                limit=f"<= {_LIMITS[field]} characters",
            )
        if "\x00" in value:
            raise ValidationError(f"{field} contains a NUL character", field=field, limit="no NUL")
    tags = [] if tags is None else tags
    if (
        not isinstance(tags, (list, tuple))
        or len(tags) > MAX_TAGS
        or not all(isinstance(t, str) and "\x00" not in t for t in tags)
    ):
        raise ValidationError(
            f"tags must be a list of at most {MAX_TAGS} str, got {tags!r}",
            field="tags",
            limit=f"<= {MAX_TAGS} str",
        )
    extra = {} if extra is None else extra
    if not isinstance(extra, dict):
        raise ValidationError(
            f"extra must be a dict, got {type(extra).__name__}", field="extra", limit="dict"
        )
    return Descriptor(
        display_name, description, owner, docs_url, tuple(tags), to_json(extra, "extra").decode()
    )


async def sync(conn: Any, queues: dict[str, Descriptor], kinds: dict[str, Descriptor]) -> None:
    """Upsert the declarations and mark them seen now (one transaction)."""
    if not queues and not kinds:
        return
    async with conn.transaction():
        repo = DescriptorRepo(conn)
        for upsert, declared in ((repo.upsert_queue, queues), (repo.upsert_kind, kinds)):
            for name, d in sorted(declared.items()):
                await upsert(d.params(name))
