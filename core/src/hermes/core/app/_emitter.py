from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import overload

from hermes.core.app._handler import HandlerRegistry
from hermes.core.app._jobs import EXPIRES_HEADER, JobHandle, Jobs
from hermes.core.app._limits import LIMIT_HEADER, Limit, Limiter
from hermes.core.model._errors import ConfigurationError, NotSupportedError
from hermes.core.model._message import Message
from hermes.core.spi._door import Door, translate_errors
from hermes.core.spi._driver import DEFAULT_PRIORITY, Driver, SupportsClaim
from hermes.core.spi._registry import enter_emit_calls, exit_calls, notify, plugin_manager


class Emitter:
    """Puts messages on a driver's broker; what a web request uses.

    ``emit`` returns as soon as ``driver.send`` returns. It is as thread-safe
    as ``driver.send``, which every driver makes thread-safe.

    Plugins implementing ``hermes_emit_call`` (tracing) run around each send
    and may add headers: the message sent is then a copy of the one given,
    with them.

    ``limits`` -- the workers' limits (a :class:`HandlerRegistry` or a mapping
    of type to :class:`~hermes.core.Limit`), kept in ``limit_store`` (else
    this Emitter's broker): each job of a type with a rate is charged its
    turn as it is emitted and sent due then, so no worker takes it before
    and none defers it (a burst of emits is spread over the turns at once).
    Optional: workers enforce their limits either way; a job that waits in its
    queue more than a minute past its turn is charged again by its worker.
    """

    def __init__(
        self,
        driver: Driver,
        logger: logging.Logger | None = None,
        *,
        records: Jobs | Driver | str | None = None,
        limits: Mapping[str, Limit] | HandlerRegistry | None = None,
        limit_store: Driver | str | None = None,
    ) -> None:
        self.driver = driver
        self.logger = logger or logging.getLogger("hermes")
        self._hooks = plugin_manager().hook
        #: Where each emitted job's record is started (None: no records, the default).
        self.records = records if isinstance(records, Jobs) or records is None else Jobs(records)
        #: Type -> its limit: a job of a type whose rate has no turn free now is
        #: sent due at its turn (see :meth:`Limiter.reserve`). Empty: none.
        self.limits: dict[str, Limit] = dict(
            limits.limits if isinstance(limits, HandlerRegistry) else limits or {}
        )
        self._limiter: Limiter | None = None
        if any(limit.rate is not None for limit in self.limits.values()):
            self._limiter = Limiter(limit_store if limit_store is not None else driver)
            self._limiter.check_driver(driver)

    def job(self, job: Message | str) -> JobHandle:
        """A handle on a job emitted here (the message, or its id): state, result, cancel.

        Needs ``records=``: without a records store there is nothing to ask.
        """
        if self.records is None:
            raise ConfigurationError(
                "this Emitter keeps no job records: give it records= (a store URL such as "
                "redis://..., or a Jobs) to follow its jobs"
            )
        return self.records.job(job)

    @overload
    def emit(
        self,
        message: Message,
        priority: int = ...,
        *,
        unique_for: None = None,
        unique_key: None = None,
        expires_in: float | None = None,
    ) -> Emitter: ...

    @overload
    def emit(
        self,
        message: Message,
        priority: int = ...,
        *,
        unique_for: float,
        unique_key: str | None = None,
        expires_in: float | None = None,
    ) -> bool: ...

    def emit(
        self,
        message: Message,
        priority: int = DEFAULT_PRIORITY,
        *,
        unique_for: float | None = None,
        unique_key: str | None = None,
        expires_in: float | None = None,
    ) -> Emitter | bool:
        """Send ``message`` on the queue of ``priority``; returns the Emitter, for chaining.

        ``unique_for=seconds`` makes it a unique job: the emit claims
        ``unique:<type>:<key>`` on the broker for that long (``key`` is
        ``unique_key``, else the message's id) and sends only if it won, so
        of any number of emits with one key in the window, one is sent. It
        then returns True when sent and False when skipped as a duplicate
        (logged at INFO; not an error). Needs a driver with
        :class:`~hermes.core.driver.SupportsClaim`, else :class:`NotSupportedError`.

        The message is serialized and held to the driver's size limit before
        the key is claimed: a :class:`SerializeError` or a size refusal leaves
        the key free. A send that fails after the claim (the broker went away
        in between) raises, and the key stays claimed for the window -- claims
        cannot be taken back -- so an emit of the same key within it is skipped:
        emit again with another ``unique_key`` (or wait the window out) when
        the job must still run.

        ``expires_in=seconds``: a worker that takes the message later than that
        acknowledges it without running a handler (logged; recorded as
        ``expired`` with records on). It travels as a header, so the message
        (and its retry copies) carry it to any worker.
        """
        if expires_in is not None:
            message = expiring(message, expires_in)
        if self._limiter is not None:
            message = self._at_turn(message)
        if unique_for is None:
            if unique_key is not None:
                raise ValueError("unique_key needs unique_for=seconds")
            self._emitted(self._send(message, priority), priority)
            return self
        return self._emit_unique(message, priority, unique_for, unique_key or message.id)

    def _emit_unique(self, message: Message, priority: int, window_s: float, key: str) -> bool:
        driver = self.driver
        if not isinstance(driver, SupportsClaim):
            raise NotSupportedError(
                f"{driver!r} cannot claim keys, so emit(unique_for=...) cannot work on it: "
                "emit unique jobs to a broker that can (redis://, file://, postgresql://, memory://)"
            )
        if not window_s > 0:
            raise ValueError(f"unique_for must be > 0 seconds, got {window_s!r}")
        # Serialized and held to the driver's size limit before the claim: a message
        # that can never be sent must not hold its key, or its corrected re-emit
        # would be skipped as a duplicate for the whole window.
        Door(driver).serialized([message])
        claim_key = f"unique:{message.type}:{key}"
        with translate_errors(driver, f"claiming {claim_key}"):
            won = driver.claim(claim_key, window_s)
        if not won:
            self.logger.info(
                "Skipped message #%s (%s): %s was emitted in the last %g s",
                message.id,
                message.type,
                claim_key,
                window_s,
            )
            return False
        message = self._send(message, priority)
        self._emitted(message, priority)
        return True

    def _at_turn(self, message: Message) -> Message:
        """``message`` charged for its rate's next turn and due then; else as it is."""
        limit = self.limits.get(message.type)
        now = time.time()
        if limit is None or self._limiter is None or (message.execute_at or 0) > now:
            return message  # not limited, or due later: its worker decides then
        turn = self._limiter.reserve(limit, message)
        if turn is None:
            return message
        header = turn.header(message)
        assert header is not None  # a reserved turn is a charged one
        headers = {**message.headers, LIMIT_HEADER: header}
        due = now + turn.wait_s if turn.wait_s > 0 else message.execute_at
        return message.replace(execute_at=due, headers=headers)

    def _send(self, message: Message, priority: int) -> Message:
        """``driver.send`` inside the plugins' emit calls; the message as sent (their headers)."""
        hook = self._hooks.hermes_emit_call
        if not hook.get_hookimpls():
            self.driver.send(message, priority)
            return message
        message, entered = enter_emit_calls(hook, message, priority=priority, driver=self.driver)
        try:
            self.driver.send(message, priority)
        except BaseException as exc:
            exit_calls(hook, entered, exc)
            raise
        exit_calls(hook, entered, None)
        return message

    async def emit_async(self, message: Message, priority: int = DEFAULT_PRIORITY) -> Emitter:
        """``emit`` for async code: the send runs in a thread, so the event loop keeps serving.

        The blocking ``driver.send`` runs in the loop's default thread pool
        (``asyncio.to_thread``); the await ends when the broker took the message,
        and raises what ``emit`` would. Cancelling the awaiting task does not stop a
        send already under way: the message may still be emitted.
        """
        import asyncio  # imported here: synchronous users do not pay for it

        await asyncio.to_thread(self.emit, message, priority)
        return self

    def emit_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> Emitter:
        """``emit`` each of ``messages``, in one broker round trip where the driver can."""
        if self._limiter is not None:
            messages = [self._at_turn(message) for message in messages]
        hook = self._hooks.hermes_emit_call
        if not hook.get_hookimpls():
            self.driver.send_batch(messages, priority)
        else:
            sent: list[Message] = []
            entered = []
            for message in messages:
                message, entered_for_one = enter_emit_calls(
                    hook, message, priority=priority, driver=self.driver
                )
                sent.append(message)
                entered += entered_for_one
            try:
                self.driver.send_batch(sent, priority)
            except BaseException as exc:
                exit_calls(hook, entered, exc)
                raise
            exit_calls(hook, entered, None)
            messages = sent
        for message in messages:
            self._emitted(message, priority)
        return self

    def _emitted(self, message: Message, priority: int) -> None:
        if self.records is not None:
            expires = message.headers.get(EXPIRES_HEADER) if message.headers else None
            self.records.emitted(
                message, priority, expires_at=float(expires) if expires is not None else None
            )
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info(
                "Emitted message #%s (%s) priority:%s to %r",
                message.id,
                message.type,
                priority,
                self.driver,
            )
        notify(
            self._hooks.hermes_message_emitted,
            message=message,
            priority=priority,
            driver=self.driver,
        )


def expiring(message: Message, expires_in: float) -> Message:
    """A copy of ``message`` that expires ``expires_in`` seconds from now (a header)."""
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float):
        raise ValueError(f"expires_in must be a number of seconds, got {expires_in!r}")
    if not expires_in > 0:
        raise ValueError(f"expires_in must be > 0 seconds, got {expires_in!r}")
    at = time.time() + expires_in
    return message.replace(headers={**message.headers, EXPIRES_HEADER: repr(at)})
