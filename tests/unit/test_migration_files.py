"""Each migration records the number in its file name: `batonq migrate`
knows what it applied by that record."""

from __future__ import annotations

import re

from batonq.migrate import migrations

RECORD = re.compile(r"INSERT INTO batonq\.migrations \(version, name\) VALUES \((\d+), '([a-z_]+)'\)")


def test_each_migration_records_its_own_number_and_none_is_skipped() -> None:
    found = migrations()
    assert [m.version for m in found] == list(range(1, len(found) + 1))
    for m in found:
        recorded = RECORD.findall(m.sql)
        assert recorded == [(str(m.version), m.name)], f"{m.version:04d}_{m.name}.sql records {recorded}"
