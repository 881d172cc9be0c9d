"""A plain (non-editable) install ships every package of the source tree.

The editable install the suite runs from finds subpackages in the source tree, so only a build
shows a package missing from it (awa_fast.admin once was).
"""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_build_holds_every_package_and_its_data(tmp_path):
    """setuptools' build_py (what a wheel is made of, less the compiled modules) copies every
    package directory under awa_fast/ and its data files."""
    res = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    packages = {init.parent.relative_to(ROOT) for init in (ROOT / "awa_fast").rglob("__init__.py")}
    missing = sorted(str(p) for p in packages if not (tmp_path / p / "__init__.py").exists())
    assert not missing, f"packages missing from the build: {missing}"
    for data in ("awa_fast/py.typed", "awa_fast/schema/001_init.sql", "awa_fast/_ext/unique.pyi"):
        assert (tmp_path / data).exists(), data
    assert list((tmp_path / "awa_fast/web/templates").glob("*.html"))
    # the console script's module: awa-fast's is a top-level module, outside awa_fast/
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for target in scripts.values():
        path = tmp_path / target.split(":")[0].replace(".", "/")
        assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), target


def test_children_boot_the_installation_that_launched_them():
    """The launcher's children put _PACKAGE_ROOT first on sys.path: it must be the directory that
    holds this awa_fast (it once pointed one level too high after supervisor.py moved, so a
    plain install run from a source checkout booted children from the uncompiled tree)."""
    from awa_fast import supervisor

    booted = Path(supervisor._PACKAGE_ROOT, "awa_fast", "supervisor.py").resolve()
    assert booted == Path(supervisor.__file__).resolve()


def _checkout(tmp_path: Path) -> Path:
    """The committed package and pyproject.toml, unbuilt: a source checkout."""
    tree = tmp_path / "checkout"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD", "awa_fast", "pyproject.toml"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def test_a_source_checkout_without_its_extensions_says_it_shadows_the_install(tmp_path):
    # After `pip install .`, anything run from the checkout imported the checkout's awa_fast,
    # which has no compiled extensions, and was told to `pip install .` (fresh eyes).
    tree = _checkout(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", "import awa_fast"], capture_output=True, text=True, cwd=tree
    )
    assert r.returncode == 1
    assert "a source checkout, which shadows an installed awa-fast" in r.stderr, r.stderr
    assert "pip install -e ." in r.stderr


def test_extensions_present_but_not_loadable_are_not_called_missing(tmp_path):
    # A damaged or foreign build was reported as "missing ... shadows an installed awa-fast"
    # (breaker helper).
    import importlib.machinery

    tree = _checkout(tmp_path)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in ("batch", "sizing", "unique", "validate"):
        (tree / "awa_fast" / "_ext" / f"{name}{suffix}").write_bytes(b"not an ELF file")
    r = subprocess.run(
        [sys.executable, "-c", "import awa_fast"], capture_output=True, text=True, cwd=tree
    )
    assert r.returncode == 1
    assert "cannot be loaded" in r.stderr and "missing" not in r.stderr.splitlines()[-1], r.stderr
