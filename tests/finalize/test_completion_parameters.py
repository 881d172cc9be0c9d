"""A compact completion's id and run_lease arrays, packed by ``awa_fast.pg_arrays.int8_array``,
reach PostgreSQL as the same ``bigint[]`` a plain list does, at every length and bound."""

from __future__ import annotations

import struct

import psycopg
import pytest

from awa_fast import pg_arrays
from awa_fast.pg_arrays import int8_array

EDGES = [0, 1, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)]


@pytest.mark.parametrize(
    "values",
    [
        [],
        [42],
        EDGES,
        list(range(10**9, 10**9 + 100)),
        list(range(pg_arrays._CACHED_UP_TO + 5)),  # past the cached lengths: a one-off Struct
    ],
    ids=["empty", "one", "bounds", "batch", "uncached"],
)
def test_a_packed_array_is_the_array_a_list_gives(dsn, values):
    with psycopg.connect(dsn) as conn:
        packed = conn.execute("SELECT %s::bigint[]", (int8_array(values),)).fetchone()[0]
        listed = conn.execute("SELECT %s::bigint[]", (values,)).fetchone()[0]
        pairs = conn.execute(
            "SELECT count(*), bool_and(i = l) FROM unnest(%s::bigint[], %s::bigint[]) AS u(i, l)",
            (int8_array(values), int8_array(values)),
        ).fetchone()
    assert packed == listed == values
    assert pairs[0] == len(values) and pairs[1] in (True, None)


def test_the_same_length_twice_reuses_its_packer_and_stays_right(dsn):
    with psycopg.connect(dsn) as conn:
        for values in ([1, 2, 3], [7, 8, 9]):
            assert (
                conn.execute("SELECT %s::bigint[]", (int8_array(values),)).fetchone()[0] == values
            )


@pytest.mark.parametrize("bad", [[2**63], [-(2**63) - 1], [None], ["1"]])
def test_a_value_outside_bigint_is_refused_before_any_statement(bad):
    with pytest.raises(struct.error):
        int8_array(bad)
