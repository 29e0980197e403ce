"""Sentry error reports for Hermes workers.

Installed, it reports every handler failure of the process's Dispatchers
through Hermes's plugin hooks: the exception (or a handler's False), with
the message's type, id, retries, priority and headers as the
``hermes_message`` context and the outcome (``retried``, ``gave_up``, ...) as
the ``hermes.outcome`` tag; a retried failure at level warning, a message
given up at level error. The application calls ``sentry_sdk.init`` as usual.
"""

from hermes.plugins.sentry._plugin import message_context

__all__ = ["message_context"]
