"""``python -m examples.postgres_transaction.place_django_order ITEM [--fail]``.

A process of its own: Django's settings are global to a process, and the
other Django example configures different ones.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.postgres_transaction.django_settings")

import django  # settings first

django.setup()

from examples.postgres_transaction.django_orders import place_order  # noqa: E402

if __name__ == "__main__":
    try:
        place_order(sys.argv[1], fail="--fail" in sys.argv)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
