"""A plugin written for another core: its hook takes an argument no hookspec offers."""

from hermes.core import hookimpl


@hookimpl
def hermes_message_started(message: object, no_such_argument: object) -> None:
    raise AssertionError("never registered, so never called")
