"""The ``capacity`` scenario: the highest offered rate a system holds on this machine.

Each step is one soak (bench/soak.py: the paced producer, the same workers, samples every
``--sample-every`` s) of ``--capacity-step-s`` seconds at one offered rate, in a fresh database.
A step **holds** when the soak kept up (every job due was produced on schedule and the backlog
stayed bounded with no upward slope: ``soak.summarize``'s ``kept_up``) and the worst window's p99
pickup after the warm-up is at most ``--capacity-p99-ms`` (default 100 ms).

The rates tried (``--capacity-search``):

* ``linear``: ``start``, ``start + step``, ... until a step does not hold (the issue's stepped
  ramp; slow for a fast system: ``(capacity / step)`` steps of ``step_s`` each);
* ``bisect`` (default): doubling from ``start`` until a step does not hold, then halving the
  interval between the highest rate held and the lowest not held until it is at most ``step``.

A fresh database and fresh workers per step mean no step inherits the previous step's backlog;
the warm-up (``--warmup``, default a quarter of the step) is excluded from the verdict. Reported
per system: every step (offered, completed/s, p99 worst window, CPU per job), the highest rate
held, and the CPU per job at it (workers + PostgreSQL backends, ms).
"""

from __future__ import annotations

import copy
from pathlib import Path

from bench import soak


def _held(summary: dict, p99_goal_ms: float) -> bool:
    p99 = summary.get("p99_ms_max_after_warmup")
    return bool(summary.get("kept_up")) and p99 is not None and p99 <= p99_goal_ms


def _rates(args):
    """A generator of offered rates (jobs/s); ``send(held)`` after each gives the next."""
    start, step, top = args.capacity_start, args.capacity_step, args.capacity_max
    if args.capacity_search == "linear":
        rate = start
        while rate <= top:
            held = yield rate
            if not held:
                return
            rate += step
        return
    lo, hi, rate = 0.0, None, start
    while True:
        held = yield rate
        if held:
            lo = rate
        else:
            hi = rate
        if hi is None:
            if rate >= top:
                return
            rate = min(top, rate * 2)
            continue
        if hi - lo <= step:
            return
        rate = lo + max(step, round((hi - lo) / 2 / step) * step)
        if rate >= hi:
            return


def run(adapter, dbs, args, log) -> dict:
    """Every step of ``adapter``'s capacity search; returns ``{"steps": [...], "held": rate or
    None, "at_capacity": the held step's summary or None}``."""
    steps: list[dict] = []
    best: dict | None = None
    gen = _rates(args)
    try:
        rate = next(gen)
        while True:
            step_args = copy.copy(args)
            step_args.rate = float(rate)
            step_args.duration = float(args.capacity_step_s)
            # at least four windows per step, so some fall after the warm-up
            step_args.sample_every = max(1, min(args.sample_every, int(args.capacity_step_s // 4)))
            step_args.warmup = args.warmup if args.warmup is not None else args.capacity_step_s / 4
            step_args.drain_timeout = min(args.drain_timeout, 15.0)
            log(f"{adapter.name}: capacity step {rate:,.0f}/s for {args.capacity_step_s:.0f} s")
            r = soak.run(adapter, dbs, step_args)
            s = r["summary"]
            held = r["error"] is None and _held(s, args.capacity_p99_ms)
            steps.append(
                {
                    "offered": rate,
                    "held": held,
                    "completion_rate": s.get("completion_rate_after_warmup"),
                    "p99_ms_max": s.get("p99_ms_max_after_warmup"),
                    "p50_ms_median": s.get("p50_ms_median_after_warmup"),
                    "backlog_max": s.get("backlog_max_after_warmup"),
                    "backlog_slope_per_s": s.get("backlog_slope_per_s"),
                    "kept_up": s.get("kept_up"),
                    "cpu_ms_per_job": s.get("cpu_ms_per_job_after_warmup"),
                    "error": r["error"],
                }
            )
            log(
                f"{adapter.name}: capacity step {rate:,.0f}/s "
                f"{'held' if held else 'NOT held'}: completed "
                f"{(s.get('completion_rate_after_warmup') or 0):,.0f}/s, p99 worst "
                f"{s.get('p99_ms_max_after_warmup')} ms, kept up {s.get('kept_up')}"
            )
            if held and (best is None or rate > best["offered"]):
                best = steps[-1]
            rate = gen.send(held)
    except StopIteration:
        pass
    return {
        "steps": steps,
        "held": best["offered"] if best else None,
        "at_capacity": best,
    }


def plot(runs: dict[str, dict], path: Path, p99_goal_ms: float) -> None:
    """One PNG: per system, completed vs offered rate and the worst p99 per step (held steps
    filled, steps not held hollow)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib: pip install -e '.[bench]'")
        return
    fig, (ax_rate, ax_p99) = plt.subplots(1, 2, figsize=(14, 5.5))
    top = 1.0
    for i, (system, r) in enumerate(runs.items()):
        steps = sorted(r["steps"], key=lambda s: s["offered"])
        if not steps:
            continue
        color = f"C{i}"
        xs = [s["offered"] for s in steps]
        top = max(top, *xs)
        ax_rate.plot(xs, [s["completion_rate"] or 0 for s in steps], color=color, label=system)
        ax_p99.plot(
            xs,
            [float("nan") if s["p99_ms_max"] is None else s["p99_ms_max"] for s in steps],
            color=color,
            label=system,
        )
        for s in steps:
            face = color if s["held"] else "none"
            ax_rate.plot(s["offered"], s["completion_rate"] or 0, "o", mfc=face, mec=color)
            if s["p99_ms_max"] is not None:
                ax_p99.plot(s["offered"], s["p99_ms_max"], "o", mfc=face, mec=color)
        if r["held"]:
            ax_rate.axvline(r["held"], color=color, ls=":", lw=1)
    ax_rate.plot([0, top], [0, top], color="black", ls="--", lw=1, label="completed = offered")
    ax_rate.set_xlabel("offered jobs/s")
    ax_rate.set_ylabel("completed jobs/s (after warm-up)")
    ax_rate.set_title("capacity: completed vs offered (filled = held; dotted = highest held)")
    ax_p99.axhline(p99_goal_ms, color="black", ls="--", lw=1, label=f"{p99_goal_ms:.0f} ms")
    ax_p99.set_yscale("log")
    ax_p99.set_xlabel("offered jobs/s")
    ax_p99.set_ylabel("ms")
    ax_p99.set_title("p99 pickup, worst window after warm-up")
    for ax in (ax_rate, ax_p99):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"capacity chart: {path}")
