"""``awa-fast demo``: the two-stage import-graph pipeline over the standard library, worked by
two worker processes, with a deliberately broken file that must fail its A job and be counted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import psycopg

from awa_fast.demo import MAX_STAGED, chunk, imported_modules

TIMEOUT_S = 300


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL")}


def run_demo(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "awa_fast", "--database-url", dsn, "demo", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=_env())


def report(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def test_imported_modules_and_chunks():
    src = b"import os.path, sys\nfrom a.b import c\nfrom . import x\nfrom .y import z\nimport os\n"
    assert imported_modules(src) == ["a", "os", "sys"]
    names = [f"m{i:02d}" for i in range(40)]
    assert chunk(names[:16], 0) == (names[:16], None)
    assert chunk(names, 0) == (names[:15], 15)
    assert chunk(names, 15) == (names[15:30], 30)
    assert chunk(names, 30) == (names[30:], None)
    assert MAX_STAGED == 16


def test_demo_pipeline_with_a_broken_file(dsn, tmp_path):
    broken = tmp_path / "broken_module.py"
    broken.write_text("import os\ndef f(:\n    pass\n")
    many = tmp_path / "many_imports.py"  # 20 distinct modules: one continuation A job
    many.write_text("".join(f"import demo_fake_mod_{i:02d}\n" for i in range(20)) + "import os\n")
    r = run_demo(dsn, "--limit", "60", "--processes", "2", "--extra-path", str(tmp_path))
    assert r.returncode == 0, (r.stdout, r.stderr)
    rep = report(r.stdout)
    assert rep["files processed"].startswith("62 ")
    assert rep["A failed"].startswith("1 ")
    assert "broken_module.py: SyntaxError: " in r.stdout
    assert re.search(r"\(\d+ files \+ 1 continuations", rep["stage A jobs"])
    assert "check: OK" in r.stdout
    assert "demo:" in r.stderr and "worker: child 1 pid" in r.stderr
    distinct = int(rep["distinct modules"])
    assert int(rep["B jobs inserted"]) == distinct
    staged = int(re.search(r"of (\d+) staged", rep["B skipped as dup"]).group(1))
    assert int(rep["B skipped as dup"].split()[0]) == staged - distinct > 0

    with psycopg.connect(dsn) as conn:
        rows = dict(conn.execute(
            "SELECT kind || ':' || state::text, count(*) FROM awa_fast.jobs "
            "WHERE queue = 'demo' GROUP BY 1").fetchall())
        names = [r[0] for r in conn.execute(
            "SELECT args->>'name' FROM awa_fast.jobs WHERE kind = 'demo_resolve_module'")]
        fake = conn.execute("SELECT count(*) FROM awa_fast_demo_modules "
                            "WHERE name LIKE 'demo_fake_mod_%%' AND NOT found").fetchone()[0]
    assert rows["demo_parse_imports:failed"] == 1
    assert rows["demo_resolve_module:completed"] == distinct
    assert len(names) == len(set(names)) == distinct  # exactly one B per distinct module
    assert {f"demo_fake_mod_{i:02d}" for i in range(20)} <= set(names)
    assert fake == 20

    # a rerun starts from scratch (JSON report) and gives the same numbers
    r2 = run_demo(dsn, "--limit", "60", "--processes", "1", "--extra-path", str(tmp_path), "--json")
    assert r2.returncode == 0, (r2.stdout, r2.stderr)
    result = json.loads(r2.stdout)
    assert result["check_ok"] is True and result["a_failed"] == 1
    assert result["distinct_modules"] == distinct and result["b_staged"] == staged
    assert result["failures"][0]["path"] == str(broken)
