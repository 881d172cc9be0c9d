"""Declares the Cython extensions only; metadata lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

EXTENSIONS = [
    Extension("awa_fast._ext.validate", ["_ext/validate.pyx"]),
    Extension("awa_fast._ext.unique", ["_ext/unique.pyx"]),
    Extension("awa_fast._ext.sizing", ["_ext/sizing.pyx"]),
    Extension("awa_fast._ext.batch", ["_ext/batch.pyx"]),
]

setup(
    ext_modules=cythonize(
        EXTENSIONS,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    ),
)
