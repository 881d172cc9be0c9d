"""The pages without actions: failure consequences owed (``/consequences``), cron schedules
(``/cron``), worker processes and the maintenance leader (``/workers``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from awa_fast.web.dashboard import dashboard


async def consequences(request: Request) -> Response:
    d = dashboard(request)
    return d.render(
        request, "consequences.html", {"nav": "consequences", **await d.reads.consequences()}
    )


async def cron(request: Request) -> Response:
    d = dashboard(request)
    return d.render(
        request, "cron.html", {"nav": "cron", "schedules": await d.client.list_cron_jobs()}
    )


async def workers(request: Request) -> Response:
    d = dashboard(request)
    return d.render(request, "workers.html", {"nav": "workers", **await d.reads.workers()})


ROUTES = [
    Route("/consequences", consequences),
    Route("/cron", cron),
    Route("/workers", workers),
]
