"""``python -m hermes.conformance URL [pytest arguments]``: run the kit on the driver for URL.

The same as ``pytest --pyargs hermes.conformance --hermes-url URL [pytest arguments]``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest

USAGE = """\
usage: python -m hermes.conformance URL [pytest arguments]

Runs the Hermes conformance kit against the installed driver for URL, e.g.
    python -m hermes.conformance redis://localhost:6379/0 -x
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print(USAGE, file=sys.stderr, end="")
        return 0 if args and args[0] in ("-h", "--help") else 2
    url, rest = args[0], args[1:]
    return int(pytest.main(["--pyargs", "hermes.conformance", "--hermes-url", url, *rest]))


if __name__ == "__main__":
    sys.exit(main())
