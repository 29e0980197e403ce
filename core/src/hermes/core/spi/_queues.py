"""Priority queues named by the user: ``NAME:PRIORITY``.

The same spelling serves ``hermes emit/worker --queue hermes_high:200`` and
the ``priority_queues`` option that every broker URL accepts
(``redis://localhost/0?priority_queues=hermes_high:200,hermes_low:50``), so a
Python worker or emitter can use the queue names an existing deployment (a
PHP one, say) already set up with ``setupPriorityQueue``. What a driver makes
of the name is its own affair, as with ``setup_priority_queue(name, priority)``.
"""

from __future__ import annotations

from dataclasses import replace

from hermes.core.model._errors import ConfigurationError
from hermes.core.spi._driver import Driver
from hermes.core.spi._url import DriverUrl

#: The URL option, read by :func:`hermes.core.connect` for every driver.
PRIORITY_QUEUES_OPTION = "priority_queues"


def parse_queue(text: str) -> tuple[str, int]:
    """``"hermes_high:200"`` -> ``("hermes_high", 200)``.

    The priority follows the last ``:``, so a name may hold colons itself
    (``app:hermes_high:200``, a Redis key with a prefix).
    """
    name, sep, priority = text.strip().rpartition(":")
    if not sep or not name:
        raise ConfigurationError(
            f"queue {text!r} must be NAME:PRIORITY, e.g. hermes_high:200 (the queue named "
            "hermes_high holds priority 200)"
        )
    try:
        number = int(priority)
    except ValueError:
        raise ConfigurationError(
            f"queue {text!r}: the priority after the last ':' must be a whole number, "
            f"got {priority!r}"
        ) from None
    return name, number


def parse_queues(items: list[str], where: str) -> dict[int, str]:
    """Priority -> name from several ``NAME:PRIORITY`` items; ``where`` says where they came from.

    A priority given twice, or a name given to two priorities, is an error:
    either would leave one of them unread or mixed with another.
    """
    queues: dict[int, str] = {}
    for item in items:
        try:
            name, priority = parse_queue(item)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        if priority in queues and queues[priority] != name:
            raise ConfigurationError(
                f"{where} names priority {priority} twice: {queues[priority]!r} and {name!r}"
            )
        for other, other_name in queues.items():
            if other_name == name and other != priority:
                raise ConfigurationError(
                    f"{where} gives queue {name!r} two priorities: {other} and {priority}"
                )
        queues[priority] = name
    return queues


def url_queues(url: DriverUrl) -> dict[int, str]:
    """The queues of ``url``'s ``priority_queues`` option (empty without one)."""
    text = url.options.get(PRIORITY_QUEUES_OPTION)
    if text is None:
        return {}
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigurationError(
            f"option {PRIORITY_QUEUES_OPTION} in {url.redacted!r} is empty; give "
            f"NAME:PRIORITY items separated by commas, e.g. hermes_high:200,hermes_low:50"
        )
    return parse_queues(items, f"option {PRIORITY_QUEUES_OPTION} in {url.redacted!r}")


def without_queues(url: DriverUrl) -> DriverUrl:
    """``url`` without the ``priority_queues`` option, for the driver's own option check."""
    if PRIORITY_QUEUES_OPTION not in url.options:
        return url
    options = {k: v for k, v in url.options.items() if k != PRIORITY_QUEUES_OPTION}
    return replace(url, options=options)


def priority_queue_name(driver: Driver, priority: int) -> str:
    """The name ``hermes worker`` and ``hermes emit`` give the queue of ``priority``.

    ``<key>_priority_<P>``, where ``key`` is the driver's base queue key where
    it has one (Redis: ``hermes``), without the driver's ``prefix``, which the
    driver puts in front of every name it is given: the name is a neighbour of
    its default queue, and every process that sets the queue up this way
    agrees on it. ``--queue NAME:P`` or the URL's ``priority_queues`` name it
    otherwise (PHP deployments use their own names, e.g. ``hermes_high``).
    """
    key = getattr(driver, "key", None)
    if not isinstance(key, str) or not key:
        key = "hermes"
    # ``key`` carries the driver's prefix, and setup_priority_queue() adds it again.
    prefix = getattr(driver, "prefix", "")
    if isinstance(prefix, str) and prefix and key.startswith(prefix):
        key = key[len(prefix) :]
    return f"{key}_priority_{priority}"
