"""A pytest plugin for the kit's self-test: each test's report as a JSON line.

Loaded into the inner run with ``-p kit_outcomes``; writes to the file named
by ``KIT_OUTCOMES_FILE``.
"""

from __future__ import annotations

import json
import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("KIT_OUTCOMES_FILE")
    if not path:
        return
    reason = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2].removeprefix("Skipped: ")
    record = {
        "test": report.nodeid.split("::")[-1].split("[")[0],
        "when": report.when,
        "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"),
        "reason": reason,
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
