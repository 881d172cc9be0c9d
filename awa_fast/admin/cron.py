"""Cron admin: :class:`CronAdmin`, the stored periodic schedules (``awa_fast.cron_jobs``; the
schedule logic is in :mod:`awa_fast.periodic`)."""

from __future__ import annotations

from awa_fast.admin.area import Area


class CronAdmin(Area):
    """List and delete stored schedules (exposed on ``AsyncClient``, ADR 041)."""

    async def list_cron_jobs(self) -> list[dict]:
        """Every stored periodic schedule as a dict: the ``awa_fast.cron_jobs`` columns
        (``last_fire_at`` = the scheduled fire time last enqueued, also as awa's
        ``last_enqueued_at``) plus ``next_fire_at``; timestamps are ISO 8601 strings.
        """
        from awa_fast import periodic  # croniter loads only when schedules are used

        async with self._db.connection() as conn:
            return await periodic.list_schedules(conn)

    async def delete_cron_job(self, name: str) -> bool:
        """Delete a stored schedule; ``True`` if it existed. A process that still registers it
        upserts it again at its next ``start()``.
        """
        from awa_fast import periodic

        async with self._db.connection() as conn:
            return await periodic.delete_schedule(conn, name)
