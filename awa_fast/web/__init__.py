"""The web dashboard (``awa-fast serve``): queues, jobs, lineage, DLQ, failure consequences,
cron schedules, workers and the maintenance leader, with CSRF-protected admin actions.

:func:`create_app` builds the Starlette application; :func:`awa_fast.web.serve.run` serves it with
uvicorn, core dependencies of awa-fast (the ``web`` extra is an empty alias). See docs/dashboard.md.
"""

from awa_fast.web.app import create_app

__all__ = ["create_app"]
