"""Model checks of the protocols (models/*.pml, see models/README.md), run exhaustively by spin.

Positive configurations must verify with no error over the complete state space (not cut by the
depth limit, no bitstate approximation); each negative configuration must fail with the invariant
it is built to break (found by replaying the counterexample trail, not just "some error").
spin and a C compiler are required: a missing one fails these tests (``.ci/run`` installs spin).
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

MODELS = pathlib.Path(__file__).resolve().parents[2] / "models"
DEPTH = 1_000_000  # pan -m: far above every model's depth; a truncated search fails the test

# (model, defines, expected violated invariant or None for "must verify")
CASES = [
    ("staged_finalization.pml", [], None),
    ("staged_finalization.pml", ["BATCHED"], None),
    (
        "staged_finalization.pml",
        ["NEG_FOLLOWUPS_BEFORE"],
        "follow_up_traces_to_committed_completion",
    ),
    ("staged_finalization.pml", ["NEG_FOLLOWUPS_AFTER"], "completion_has_follow_up_or_holder"),
    ("staged_finalization.pml", ["NEG_NO_LEASE_GUARD"], "only_current_lease_completes"),
    ("staged_finalization.pml", ["NEG_DRAIN_ON_FIRST"], "completion_has_follow_up_or_holder"),
    ("staged_finalization.pml", ["NEG_COMPACT_PATH"], "completion_has_follow_up_or_holder"),
    (
        "staged_finalization.pml",
        ["BATCHED", "NEG_BATCH_BY_ID"],
        "follow_up_traces_to_committed_completion",
    ),
    ("settlement.pml", [], None),
    ("settlement.pml", ["NEG_VERDICT_FIRST"], "failed_job_has_effect_applied_or_owed"),
    ("settlement.pml", ["NEG_SETTLE_FIRST"], "failed_job_has_effect_applied_or_owed"),
    ("settlement.pml", ["NEG_PRUNE_OWED"], "nothing_owed_is_lost"),
    ("settlement.pml", ["NEG_RETRY_OWED"], "nothing_owed_is_lost"),
    ("settlement.pml", ["NEG_CANCEL_OWED"], "nothing_owed_is_lost"),
    ("settlement.pml", ["NEG_EFFECT_FIRST"], "effect_repeats_only_as_repeat"),
    ("leader_fencing.pml", [], None),
    ("leader_fencing.pml", ["BOTH_DIRECT"], None),
    ("leader_fencing.pml", ["BOTH_POOLED"], None),
    ("leader_fencing.pml", ["NEG_NO_FENCE"], "no_interleaved_leader_writes"),
    ("leader_fencing.pml", ["NEG_FENCE_NO_SHARE"], "no_interleaved_leader_writes"),
    ("leader_fencing.pml", ["NEG_CHECK_LOCK_CONN"], "no_interleaved_leader_writes"),
    ("lease_rescue.pml", [], None),
    ("lease_rescue.pml", ["NEG_TODAY"], "no_overlapping_executions"),
    ("lease_rescue.pml", ["NEG_NO_EXPIRY"], "no_overlapping_executions"),
    ("lease_rescue.pml", ["NEG_NO_EXIT"], "no_overlapping_executions"),
]


def _case_id(case) -> str:
    model, defines, _ = case
    return "-".join([model.removesuffix(".pml")] + defines) or model


def _run(cmd: list[str], cwd: pathlib.Path, timeout: float = 600) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 or cmd[0] == "./pan", f"{' '.join(cmd)} failed:\n{out}"
    return out


def check(model: str, defines: list[str], workdir: pathlib.Path, *, optimize: bool = True) -> dict:
    """Generate, compile and run the verifier for one configuration in ``workdir``.

    Returns ``{"errors", "states", "depth", "seconds", "output", "violated"}`` where ``violated``
    lists the invariant names the trail replay printed (empty when there is no trail).
    """
    for tool in ("spin", "gcc"):
        assert shutil.which(tool), f"{tool} is not installed (.ci/run installs spin)"
    shutil.copy(MODELS / model, workdir / model)
    flags = [f"-D{d}" for d in defines]
    _run(["spin", *flags, "-a", model], workdir)
    # -O2 pays off only on the large positive searches; counterexamples are found in a few
    # hundred states, where compiling dominates.
    _run(
        ["gcc", "-O2" if optimize else "-O0", "-w", "-DSAFETY", "-DCOLLAPSE", "-o", "pan", "pan.c"],
        workdir,
    )
    out = _run(["./pan", f"-m{DEPTH}"], workdir)
    errors = re.search(r"errors: (\d+)", out)
    states = re.search(r"(\d+) states, stored", out)
    depth = re.search(r"depth reached (\d+)", out)
    seconds = re.search(r"elapsed time ([\d.e+]+) seconds", out)
    assert errors and states and depth, f"unexpected pan output:\n{out}"
    violated = []
    if (workdir / f"{model}.trail").exists():
        replay = _run(["spin", *flags, "-t", model], workdir)
        violated = re.findall(r"INVARIANT VIOLATED: (\w+)", replay)
    return {
        "errors": int(errors.group(1)),
        "states": int(states.group(1)),
        "depth": int(depth.group(1)),
        "seconds": float(seconds.group(1)) if seconds else None,
        "output": out,
        "violated": violated,
    }


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_model(case, tmp_path):
    model, defines, expected = case
    result = check(model, defines, tmp_path, optimize=expected is None)
    out = result["output"]
    print(
        f"{_case_id(case)}: {result['states']} states, depth {result['depth']}, "
        f"{result['seconds']} s, violated {result['violated']}"
    )
    if expected is None:
        assert result["errors"] == 0, f"the model found a violation:\n{out}"
        assert "Full statespace search" in out, out  # exhaustive, not bitstate
        assert "max search depth too small" not in out, out  # not truncated
        assert result["depth"] < DEPTH
        assert not result["violated"]
    else:
        assert result["errors"] >= 1, f"negative configuration {defines} verified:\n{out}"
        assert result["violated"] == [expected], result["violated"]


if __name__ == "__main__":  # the table in models/README.md: python -m tests.structure.test_models
    import tempfile
    import time

    for case in CASES:
        model, defines, expected = case
        with tempfile.TemporaryDirectory() as d:
            started = time.monotonic()
            r = check(model, defines, pathlib.Path(d), optimize=expected is None)
            wall = time.monotonic() - started
        print(
            f"| {model.removesuffix('.pml')} | {' '.join(defines) or '(default)'} | "
            f"{r['states']:,} | {r['depth']} | {r['seconds']} | {wall:.1f} | "
            f"{', '.join(r['violated']) or str(r['errors']) + ' errors'} |",
            flush=True,
        )
