"""The jobs list (``/jobs``), one job with its lineage and errors (``/jobs/{id}``), and its
actions: retry, cancel."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from awa_fast.web.dashboard import dashboard, done, job_action
from awa_fast.web.inputs import name, path_id, positive_id, state
from awa_fast.web.rendering import error_parts


async def jobs(request: Request) -> Response:
    d = dashboard(request)
    p = request.query_params
    filters = {
        "queue": name(p.get("queue"), "queue"),
        "kind": name(p.get("kind"), "kind"),
        "state": state(p.get("state")),
    }
    before = positive_id(p.get("before"), "before")
    page = await d.reads.jobs(**filters, before=before)
    return d.render(request, "jobs.html", {"nav": "jobs", "page": page, "filters": filters})


async def job(request: Request) -> Response:
    d = dashboard(request)
    job_id = path_id(request)
    row = await d.reads.job(job_id)
    if row is None:
        raise HTTPException(404, f"no job {job_id} (neither in awa_fast.jobs_all nor in the DLQ)")
    trigger, trigger_id, children = await d.reads.lineage(row)
    errors = [error_parts(e) for e in (row.get("errors") or [])]
    return d.render(
        request,
        "job.html",
        {
            "nav": "jobs",
            "job": row,
            "errors": errors,
            "trigger": trigger,
            "trigger_id": trigger_id,
            "children": children,
        },
    )


async def job_retry(request: Request) -> Response:
    d, job_id = await job_action(request)
    retried = await d.client.retry(job_id)  # UniqueConflict: the 409 handler
    if retried is None:
        return await _wrong_state(
            request,
            job_id,
            "retried",
            "only failed, cancelled or waiting_external jobs whose consequence is not owed",
        )
    return done(request, f"job {job_id} retried: available again with attempt 0", f"/jobs/{job_id}")


async def job_cancel(request: Request) -> Response:
    d, job_id = await job_action(request)
    if await d.client.cancel(job_id) is None:
        return await _wrong_state(request, job_id, "cancelled", "only unfinished jobs")
    return done(request, f"job {job_id} cancelled", f"/jobs/{job_id}")


async def _wrong_state(request: Request, job_id: int, verb: str, rule: str) -> Response:
    d = dashboard(request)
    row = await d.reads.job(job_id)
    if row is None:
        return d.error_page(request, 404, f"no job {job_id}")
    where = "in the DLQ" if row["in_dlq"] else f"{row['state']}"
    return d.error_page(request, 409, f"job {job_id} is {where}: not {verb} ({rule} can be)")


ROUTES = [
    Route("/jobs", jobs),
    Route("/jobs/{job_id}", job),
    Route("/jobs/{job_id}/retry", job_retry, methods=["POST"]),
    Route("/jobs/{job_id}/cancel", job_cancel, methods=["POST"]),
]
