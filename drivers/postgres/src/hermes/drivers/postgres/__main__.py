"""``python -m hermes.drivers.postgres schema|create URL``: the tables of a driver URL.

``schema`` prints the DDL (for a migration tool, or a DBA who runs it), and
``create`` runs it; both read the table and schema from the URL's options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hermes.core import HermesError, connect, redact_url
from hermes.core.drivertools import Door
from hermes.drivers.postgres._driver import PostgresDriver


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hermes.drivers.postgres", description=__doc__)
    parser.add_argument("action", choices=["schema", "create"])
    parser.add_argument("url", help="postgresql://user@host:5432/db?table=...&schema=...")
    args = parser.parse_args(argv)
    try:
        driver = connect(args.url)
        if not isinstance(driver, PostgresDriver):
            print(f"error: {redact_url(args.url)} is not a postgresql:// URL", file=sys.stderr)
            return 2
        with driver:
            if args.action == "schema":
                print(driver.schema_sql(), end="")
            else:
                Door(driver).call("creating the tables", driver.create_tables)
                print(f"created {driver.names.messages} and {driver.names.rejected}")
    except HermesError as exc:
        print(f"error: {redact_url(str(exc))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
