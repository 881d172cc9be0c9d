"""``PartitionedQueue``: one hot logical queue spread over several ordinary physical queues, with
awa's naming and routing, so producers and workers of awa-pg and awa-fast agree.

Names: partition 0 is the logical name itself, partition i > 0 is ``{logical}__p{i}``. Key
routing: FNV-1a 64 of the key bytes, xor a domain constant, a SplitMix64 finalizer, modulo the
partition count (awa's ``partition_for_ordering_key``). Source: awa ``awa-model/src/
partitioned_queue.rs`` (ADR-031).
"""

from __future__ import annotations

from typing import Any

from awa_fast.errors import ValidationError

_MASK = (1 << 64) - 1
_DOMAIN = 0x9D4D_1B2F_53A7_0C91
_MAX_PARTITIONS = 32767


def _fnv1a64(data: bytes) -> int:
    h = 14_695_981_039_346_656_037
    for byte in data:
        h = (h * 1_099_511_628_211 + byte) & _MASK  # awa's variant: multiply, then add
    return h


def partition_hash64(key: bytes) -> int:
    """awa's partition-routing hash of ``key`` (domain-separated from enqueue sharding)."""
    v = _fnv1a64(key) ^ _DOMAIN
    v ^= v >> 30
    v = (v * 0xBF58_476D_1CE4_E5B9) & _MASK
    v ^= v >> 27
    v = (v * 0x94D0_49BB_1331_11EB) & _MASK
    return v ^ (v >> 31)


def _key_bytes(key: Any) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise ValidationError("ordering_key must be bytes-like or str", field="ordering_key")


def _index(index: Any) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValidationError("index must be >= 0", field="index", limit=">= 0")
    return index


class PartitionedQueue:
    """``PartitionedQueue(logical_queue, partitions)``.

    Raises:
        ValidationError: empty logical name, ``partitions`` < 1 or > 32767.
    """

    def __init__(self, logical_queue: str, partitions: int):
        _check_logical(logical_queue)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions <= 0:
            raise ValidationError(
                "partitioned queue partitions must be > 0", field="partitions", limit="> 0"
            )
        _check_count(partitions)
        self._logical = logical_queue
        self._physical = [logical_queue] + [f"{logical_queue}__p{i}" for i in range(1, partitions)]

    @classmethod
    def from_physical_queues(
        cls, logical_queue: str, physical_queues: list[str]
    ) -> PartitionedQueue:
        """Use existing queue names as the partitions, in order.

        Raises:
            ValidationError: empty logical or physical name, no queues, a duplicate.
        """
        _check_logical(logical_queue)
        queues = list(physical_queues)
        if not queues:
            raise ValidationError("partitioned queue partitions must be > 0", field="partitions")
        _check_count(len(queues))
        seen: set[str] = set()
        for q in queues:
            if not q:
                raise ValidationError(
                    "partitioned queue physical queue must not be empty", field="physical_queues"
                )
            if q in seen:
                raise ValidationError(
                    f"partitioned queue physical queue '{q}' is duplicated", field="physical_queues"
                )
            seen.add(q)
        self = cls.__new__(cls)
        self._logical, self._physical = logical_queue, queues
        return self

    @property
    def logical_queue(self) -> str:
        return self._logical

    @property
    def physical_queues(self) -> list[str]:
        return list(self._physical)

    @property
    def partitions(self) -> int:
        return len(self._physical)

    def __len__(self) -> int:
        return len(self._physical)

    def __repr__(self) -> str:
        return f"PartitionedQueue(logical_queue={self._logical!r}, partitions={len(self)})"

    def queue_for_key(self, key: bytes | str) -> str:
        """The physical queue of ``key`` (str is UTF-8 encoded); stable for a key."""
        data = _key_bytes(key)
        n = len(self._physical)
        return self._physical[0 if n <= 1 else partition_hash64(data) % n]

    def queue_for_index(self, index: int) -> str:
        """Round robin: the queue of partition ``index % partitions`` (``index`` >= 0)."""
        return self._physical[_index(index) % len(self._physical)]

    def route_by_key(self, key: bytes | str) -> dict:
        """Insert keywords ``{"queue", "ordering_key"}`` for ``key``: ``insert(args, **route)``."""
        return {"queue": self.queue_for_key(key), "ordering_key": _key_bytes(key)}

    def route_by_index(self, index: int) -> dict:
        """Insert keywords ``{"queue"}`` for round-robin ``index``."""
        return {"queue": self.queue_for_index(index)}

    def queue_configs(
        self,
        max_workers_per_partition: int | None = None,
        *,
        min_workers_per_partition: int | None = None,
        weight: int = 1,
        rate_limit_per_partition: tuple[float, int] | None = None,
        priority_aging_interval_ms: int | None = None,
        deadline_duration_ms: int | None = None,
        claimers: int | None = None,
        claim_batch_size: int | None = None,
    ) -> list[dict]:
        """One ``start()`` queue dict per partition, with the given per-partition settings
        (only those given appear). ``min_workers_per_partition``/``weight`` build awa's weighted
        configs, which ``start()`` rejects as not implemented.

        Raises:
            ValidationError: neither or both worker counts, a count/weight/claimers/batch of 0.
        """
        if max_workers_per_partition is not None and min_workers_per_partition is not None:
            raise ValidationError(
                "use max_workers_per_partition or min_workers_per_partition, not both",
                field="max_workers_per_partition",
            )
        if max_workers_per_partition is None and min_workers_per_partition is None:
            raise ValidationError(
                "queue_configs requires max_workers_per_partition or min_workers_per_partition",
                field="max_workers_per_partition",
            )
        for value, name in (
            (max_workers_per_partition, "max_workers_per_partition"),
            (weight, "weight"),
            (claimers, "claimers"),
            (claim_batch_size, "claim_batch_size"),
        ):
            if value == 0:
                raise ValidationError(f"{name} must be > 0", field=name, limit="> 0")
        extra = {
            "rate_limit": rate_limit_per_partition,
            "priority_aging_interval_ms": priority_aging_interval_ms,
            "deadline_duration_ms": deadline_duration_ms,
            "claimers": claimers,
            "claim_batch_size": claim_batch_size,
        }
        out = []
        for q in self._physical:
            cfg: dict[str, Any] = {"name": q}
            if max_workers_per_partition is not None:
                cfg["max_workers"] = max_workers_per_partition
            else:
                cfg["min_workers"], cfg["weight"] = min_workers_per_partition, weight
            cfg.update({k: v for k, v in extra.items() if v is not None})
            out.append(cfg)
        return out


def _check_logical(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValidationError(
            "partitioned queue logical queue must not be empty", field="logical_queue"
        )


def _check_count(n: int) -> None:
    if n > _MAX_PARTITIONS:
        raise ValidationError(
            f"partitioned queue supports at most {_MAX_PARTITIONS} physical queues; got {n}",
            field="partitions",
            limit=f"<= {_MAX_PARTITIONS}",
        )
