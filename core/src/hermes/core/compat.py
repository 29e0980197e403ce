"""PHP Hermes's worker API, for code ported from it.

PHP Hermes runs a worker through the driver and the dispatcher:
``$driver->setMaxProcessItems(10); $dispatcher->handle();``. In Hermes for
Python the run is a :class:`~hermes.core.Worker` of its own, and this module
keeps the PHP spelling on top of it::

    from hermes.core import compat

    compat.set_max_process_items(driver, 10)
    compat.Dispatcher(driver).register_handler("mail", SendMail()).handle()

New code runs a Worker: ``Worker(driver, dispatcher, max_items=10).run()``.
Nothing in Hermes imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hermes.core.app._dispatcher import Dispatcher as _Dispatcher
from hermes.core.model._message import Message
from hermes.core.run._worker import Worker
from hermes.core.spi._driver import Driver
from hermes.core.spi._shutdown import Shutdown

__all__ = ["Dispatcher", "set_max_process_items", "set_shutdown", "wait"]

#: ``callback(message, priority) -> bool``, what :func:`wait` calls per message.
Callback = Callable[[Message, int], bool]


@dataclass(slots=True)
class _PhpSettings:
    """What PHP's setters configured on a driver, for :func:`wait` and ``handle()`` alone."""

    max_items: int = 0
    shutdown: Shutdown | None = None


def _settings(driver: Driver) -> _PhpSettings:
    settings: _PhpSettings | None = driver.__dict__.get("_php_settings")
    if settings is None:
        settings = driver.__dict__["_php_settings"] = _PhpSettings()
    return settings


def set_max_process_items(driver: Driver, count: int) -> None:
    """PHP's ``setMaxProcessItems``: a later :func:`wait` or ``handle()`` returns after ``count``.

    Each run counts from 0; 0 means no limit.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"max process items must be a whole number >= 0, got {count!r}")
    _settings(driver).max_items = count


def set_shutdown(driver: Driver, shutdown: Shutdown | None) -> None:
    """PHP's ``setShutdown``: a later :func:`wait` or ``handle()`` returns once it asks."""
    _settings(driver).shutdown = shutdown


def wait(
    driver: Driver,
    callback: Callback,
    priorities: Sequence[int] = (),
    *,
    concurrency: int = 1,
    grace_s: float = 30.0,
) -> None:
    """PHP's ``$driver->wait($callback)``: a :class:`~hermes.core.Worker` run of ``callback``.

    ``callback(message, priority) -> bool`` is called per message until the
    limit of :func:`set_max_process_items` or the :func:`set_shutdown`
    request. Signals are left to the caller, as PHP's ``wait`` does.
    """
    settings = _settings(driver)
    Worker(
        driver,
        callback,
        priorities=priorities,
        concurrency=concurrency,
        grace_s=grace_s,
        max_items=settings.max_items,
        shutdown=settings.shutdown,
        handle_signals=False,
    ).run()


class Dispatcher(_Dispatcher):
    """:class:`hermes.core.Dispatcher` with PHP's blocking ``handle()``."""

    def handle(self, priorities: Sequence[int] = ()) -> None:
        """Handle messages until shutdown, max items, SIGTERM or SIGINT: a Worker run.

        ``priorities`` restricts the run to those priority queues. A driver
        failure is logged with its cause and raised. :func:`set_max_process_items`
        and :func:`set_shutdown` on the driver count; the dispatcher's own
        ``shutdown`` wins over the latter.
        """
        settings = _settings(self.driver)
        Worker(
            self.driver,
            self,
            priorities=priorities,
            max_items=settings.max_items,
            shutdown=self.shutdown if self.shutdown is not None else settings.shutdown,
        ).run()
