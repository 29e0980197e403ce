"""PHP Hermes 4.x and Python Hermes share one Redis: same keys, same envelope."""

from __future__ import annotations

import json
import time

import pytest

from hermes.core import Message, compat, connect
from hermes.core.compat import Dispatcher
from hermes.core.drivertools import MessageSerializer
from hermes.drivers.redis import RedisSetDriver

#: Strings as PHP Hermes 4.x's MessageSerializer (json_encode) writes them.
PHP_EMPTY_PAYLOAD = (
    '{"message":{"id":"11111111-2222-4333-8444-555555555555","type":"t",'
    '"created":1764480002,"payload":[],"execute_at":null,"retries":0}}'
)
PHP_ESCAPES = (
    '{"message":{"id":"66666666-7777-4888-9999-000000000000","type":"mail\\/send",'
    '"created":1764480002.5,"payload":{"url":"https:\\/\\/example.com\\/a\\/b",'
    '"name":"\\u017dofia \\u010cern\\u00e1"},"execute_at":null,"retries":2}}'
)
PHP_SCHEDULED_TEMPLATE = (
    '{"message":{"id":"aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee","type":"later",'
    '"created":1764480002,"payload":{"n":1},"execute_at":%s,"retries":0}}'
)


class Recorder:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def handle(self, message: Message) -> bool:
        self.messages.append(message)
        return True


def test_the_defaults_are_php_hermes_keys(client):
    driver = RedisSetDriver(client)
    assert (driver.key, driver.schedule_key, driver.refresh_interval) == (
        "hermes",
        "hermes_schedule",
        1.0,
    )


def test_php_strings_sadded_into_the_queue_are_handled_by_a_python_worker(
    driver, client, namespace
):
    client.sadd(namespace, PHP_EMPTY_PAYLOAD, PHP_ESCAPES)
    recorder = Recorder()
    compat.set_max_process_items(driver, 2)
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("t", recorder).register_handler("mail/send", recorder)
    dispatcher.handle()
    by_id = {m.id: m for m in recorder.messages}
    empty = by_id["11111111-2222-4333-8444-555555555555"]
    assert (empty.type, empty.payload, empty.created, empty.execute_at, empty.retries) == (
        "t",
        {},
        1764480002.0,
        None,
        0,
    )
    escaped = by_id["66666666-7777-4888-9999-000000000000"]
    assert escaped.type == "mail/send"
    assert escaped.payload == {"url": "https://example.com/a/b", "name": "Žofia Černá"}
    assert (escaped.created, escaped.retries) == (1764480002.5, 2)


def test_a_php_scheduled_message_is_moved_when_due_and_handled(
    driver, client, namespace, start_worker, eventually
):
    due = int(time.time()) + 1  # PHP writes whole seconds as often as not
    client.zadd(f"{namespace}_schedule", {PHP_SCHEDULED_TEMPLATE % due: due})
    worker = start_worker(driver)
    eventually(lambda: worker.handled, "the PHP-scheduled message")
    handled_at = time.time()
    worker.join()
    assert handled_at >= due
    [(message, _)] = worker.handled
    assert (message.type, message.payload, message.execute_at) == ("later", {"n": 1}, float(due))


def test_a_python_string_decodes_by_the_rules_php_uses(driver, client, namespace):
    message = Message("mail/send", {"name": "Žofia", "tags": ["a", "b"]}, execute_at=None)
    driver.send(message)
    [body] = client.smembers(namespace)
    text = body.decode("ascii")  # PHP json_encode output is ASCII with \\uXXXX escapes
    assert "\\u017dofia" in text
    envelope = json.loads(text)
    assert list(envelope) == ["message"]
    fields = envelope["message"]
    assert list(fields) == ["id", "type", "created", "payload", "execute_at", "retries"]
    assert fields["type"] == "mail/send"
    assert fields["payload"] == {"name": "Žofia", "tags": ["a", "b"]}
    assert (fields["execute_at"], fields["retries"]) == (None, 0)
    assert isinstance(fields["created"], float)
    assert MessageSerializer().unserialize(body).id == message.id


def test_a_python_scheduled_message_has_its_execute_at_as_the_score(driver, client, namespace):
    execute_at = time.time() + 3600
    driver.send(Message("later", execute_at=execute_at))
    [(body, score)] = client.zrange(f"{namespace}_schedule", 0, -1, withscores=True)
    assert json.loads(body)["message"]["execute_at"] == execute_at
    assert score == execute_at


def test_php_named_priority_sets_are_read_through_the_url_s_priority_queues(
    redis_url, client, namespace, start_worker, eventually
):
    # PHP: $driver->setupPriorityQueue('<ns>_high', 200), then emit(..., 200) SADDs there.
    high = f"{namespace}_high"
    client.sadd(high, PHP_ESCAPES)
    url = f"{redis_url}?key={namespace}&schedule_key={namespace}_schedule&refresh_interval=0.2"
    with connect(f"{url}&priority_queues={high}:200") as driver:
        worker = start_worker(driver)
        eventually(lambda: worker.handled, "the message in the PHP-named set")
        worker.join()
    [(message, priority)] = worker.handled
    assert (message.id, priority) == ("66666666-7777-4888-9999-000000000000", 200)


def test_python_refuses_a_message_php_s_message_class_would_die_on(driver, client, namespace):
    # PHP 4.x: Message(string $type, ?array $payload, ?string $messageId, ...) under
    # strict_types: a scalar payload or an int id is a TypeError in the PHP worker,
    # after the message has been popped.
    for bad in (lambda: Message("t", "just a string"), lambda: Message("t", {}, id=123)):
        with pytest.raises(ValueError):
            driver.send(bad())
    assert client.scard(namespace) == 0


def test_bodies_php_reads_without_created_or_with_a_string_retries_are_handled_not_set_aside(
    driver, client, namespace
):
    # PHP Hermes 4.2's unserialize takes both: a missing created becomes microtime(true),
    # "retries":"2" goes through intval(). Hand-written producers send such bodies.
    no_created = '{"message":{"id":"no-created","type":"t","payload":{"n":1},"retries":0}}'
    string_retries = (
        '{"message":{"id":"string-retries","type":"t","created":1764480002,'
        '"payload":null,"execute_at":"1764480000","retries":"2"}}'
    )
    client.sadd(namespace, no_created, string_retries)
    recorder = Recorder()
    compat.set_max_process_items(driver, 2)
    before = time.time()
    Dispatcher(driver).register_handler("t", recorder).handle()
    by_id = {m.id: m for m in recorder.messages}
    assert set(by_id) == {"no-created", "string-retries"}
    assert before <= by_id["no-created"].created <= time.time()
    string = by_id["string-retries"]
    assert (string.retries, string.execute_at) == (2, 1764480000.0)
    assert client.scard(namespace) == 0
