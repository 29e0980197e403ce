"""The Hermes conformance kit: one command checks that a driver keeps its promises.

::

    pytest --pyargs hermes.conformance --hermes-url redis://localhost:6379/0
    python -m hermes.conformance redis://localhost:6379/0 [pytest arguments]

The kit is a pytest plugin (entry point ``pytest11``) that does nothing unless
``--hermes-url`` is given. It builds the driver with :func:`hermes.core.connect`,
reads its :class:`~hermes.core.Capabilities` and tests both branches of every
row. ``conformance/README.md`` is the driver author's manual.

This package imports nothing on purpose: the worker subprocess
(``python -m hermes.conformance._worker``) must start fast, and pytest
rewrites the kit's asserts only if the plugin registers them before they are
imported. It has no asserts of its own, and says so to pytest, which would
otherwise warn when ``python -m hermes.conformance`` imported it first:
PYTEST_DONT_REWRITE
"""

#: Environment variable: a factor (default 1.0) applied to every deadline of the kit.
TIME_SCALE_ENV = "HERMES_KIT_TIME_SCALE"

__all__ = ["TIME_SCALE_ENV"]
