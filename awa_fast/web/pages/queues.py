"""The queues page (``/``, ``/queues``) and its actions: pause, resume."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from awa_fast.web.dashboard import dashboard, done
from awa_fast.web.inputs import queue_field


async def home(request: Request) -> Response:
    return RedirectResponse("/queues", status_code=303)


async def queues(request: Request) -> Response:
    d = dashboard(request)
    rows = await d.reads.queues(await d.client.dlq_depth_by_queue())
    return d.render(request, "queues.html", {"nav": "queues", "queues": rows})


# The queue travels in the form, not the path: a queue name may contain "/".
async def queue_pause(request: Request) -> Response:
    d = dashboard(request)
    queue = queue_field(await d.action_form(request))
    await d.client.pause_queue(queue, paused_by="dashboard")
    return done(request, f"queue {queue} paused", "/queues")


async def queue_resume(request: Request) -> Response:
    d = dashboard(request)
    queue = queue_field(await d.action_form(request))
    await d.client.resume_queue(queue)
    return done(request, f"queue {queue} resumed", "/queues")


ROUTES = [
    Route("/", home),
    Route("/queues", queues),
    Route("/queues/pause", queue_pause, methods=["POST"]),
    Route("/queues/resume", queue_resume, methods=["POST"]),
]
