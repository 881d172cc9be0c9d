"""The dead-letter queue page (``/dlq``) and its actions: retry one entry, purge one, purge
the entries of a queue or kind."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from awa_fast.web.dashboard import dashboard, done, job_action
from awa_fast.web.inputs import bad, name, positive_id


async def dlq(request: Request) -> Response:
    d = dashboard(request)
    p = request.query_params
    filters = {"queue": name(p.get("queue"), "queue"), "kind": name(p.get("kind"), "kind")}
    before = positive_id(p.get("before"), "before")
    page = await d.reads.dlq(**filters, before=before)
    return d.render(
        request,
        "dlq.html",
        {
            "nav": "dlq",
            "page": page,
            "filters": filters,
            "depth": await d.client.dlq_depth_by_queue(),
        },
    )


async def dlq_retry(request: Request) -> Response:
    d, job_id = await job_action(request)
    retried = await d.client.retry_from_dlq(job_id)  # UniqueConflict: the 409 handler
    if retried is None:
        return d.error_page(request, 404, f"job {job_id} is not in the DLQ")
    return done(
        request,
        f"job {job_id} moved from the DLQ back to queue {retried.queue}",
        f"/jobs/{job_id}",
    )


async def dlq_purge(request: Request) -> Response:
    d, job_id = await job_action(request)
    if not await d.client.purge_dlq_job(job_id):
        return d.error_page(request, 404, f"job {job_id} is not in the DLQ")
    return done(request, f"DLQ entry {job_id} purged", "/dlq")


async def dlq_purge_matching(request: Request) -> Response:
    d = dashboard(request)
    form = await d.action_form(request)
    queue = name(form.get("queue"), "queue")
    kind = name(form.get("kind"), "kind")
    if queue is None and kind is None:
        raise bad(
            "purging the DLQ needs a queue or kind filter (the dashboard never "
            "purges the whole DLQ)"
        )
    n = await d.client.purge_dlq(queue=queue, kind=kind)
    return done(request, f"purged {n} DLQ entries", "/dlq")


ROUTES = [
    Route("/dlq", dlq),
    Route("/dlq/purge", dlq_purge_matching, methods=["POST"]),
    Route("/dlq/{job_id}/retry", dlq_retry, methods=["POST"]),
    Route("/dlq/{job_id}/purge", dlq_purge, methods=["POST"]),
]
