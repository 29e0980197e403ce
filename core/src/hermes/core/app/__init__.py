"""What an application builds with: the emitter, the dispatcher and its handlers.

Emitting, dispatching a message to its handlers, retry policies, time limits,
the failed-message store and periodic schedules. It imports the layers below
(:mod:`hermes.core.spi`, :mod:`hermes.core.model`), never the run or the CLI.
"""
