"""The Redis set as a failed-message store: listed and deleted from without popping."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from hermes_test_support import walk_pages

from hermes.core import BrokerUnavailableError, FailedStore, Message
from hermes.core.drivertools import MessageSerializer
from hermes.drivers.redis import RedisSetDriver
from hermes.drivers.redis._browse import SetBrowser


def test_the_browser_lists_every_member_and_removes_one_at_a_time(
    driver: RedisSetDriver,
) -> None:
    bodies = [f'{{"n":{n}}}'.encode() for n in range(1200)]  # more than one SSCAN page
    driver.client.sadd(driver.key, *bodies)
    browser = SetBrowser(driver)

    listed = list(browser.entries())

    assert sorted(body for _, body in listed) == sorted(bodies)
    assert all(entry == (driver.key, body) for entry, body in listed)
    assert browser.remove((driver.key, bodies[0])) is True
    assert browser.remove((driver.key, bodies[0])) is False
    assert driver.client.scard(driver.key) == 1199


def test_every_priority_s_set_is_listed_highest_first_then_the_schedule(
    driver: RedisSetDriver,
) -> None:
    driver.setup_priority_queue(f"{driver.key}_priority_300", 300)
    urgent = [Message("urgent", {"n": n}) for n in range(30)]
    normal = [Message("normal", {"n": n}) for n in range(30)]
    later = [Message("later", {"n": n}, execute_at=time.time() + 3600) for n in range(30)]
    driver.send_batch(urgent, 300)
    driver.send_batch([*normal, *later])
    browser = SetBrowser(driver)

    pages = [browser.page(None, 10, 1 << 20)]
    while pages[-1].next is not None:
        pages.append(browser.page(pages[-1].next, 10, 1 << 20))

    shown = [
        (MessageSerializer().unserialize(body).type, page.priorities[entry])
        for page in pages
        for entry, body in page.entries
    ]
    assert [t for t, _ in shown] == ["urgent"] * 30 + ["normal"] * 30 + ["later"] * 30
    assert {(t, p) for t, p in shown} == {("urgent", 300), ("normal", 100), ("later", 100)}
    scheduled = next(e for page in pages for e, _ in page.entries if e[0] == driver.schedule_key)
    assert browser.remove(scheduled) is True and browser.remove(scheduled) is False
    assert driver.client.zcard(driver.schedule_key) == 29
    assert len(list(browser.entries())) == 89


def test_pages_reach_every_member_reading_about_a_page_each(driver: RedisSetDriver) -> None:
    bodies = [f'{{"n":{n}}}'.encode() for n in range(1200)]
    driver.client.sadd(driver.key, *bodies)

    pages = walk_pages(SetBrowser(driver), 50, 1 << 20)

    assert sorted(b for page in pages for b in page) == sorted(bodies)  # none lost, none twice
    assert all(len(page) < 50 + 10 for page in pages)  # a page ends with its SSCAN batch
    assert len(pages) >= 1200 // 60


def test_a_page_of_large_bodies_stops_at_its_byte_budget(driver: RedisSetDriver) -> None:
    bodies = [bytes([65 + n % 26]) * 100_000 + str(n).encode() for n in range(60)]
    driver.client.sadd(driver.key, *bodies)

    first = SetBrowser(driver).page(None, 200, 300_000)

    assert 3 <= len(first.entries) < 3 + 10 and first.next is not None
    pages = walk_pages(SetBrowser(driver), 200, 300_000)
    assert sorted(b for page in pages for b in page) == sorted(bodies)


def test_the_plugin_offers_the_browser_to_a_store_on_another_prefix_of_the_same_redis(
    redis_url: str, namespace: str, client: redis.Redis[Any], driver: RedisSetDriver
) -> None:
    queued = Message("job")
    driver.send(queued)
    message = Message("mail", {"to": "ana"}, retries=25)

    with FailedStore.connect(f"{redis_url}?prefix={namespace}-failed:") as store:
        store.keep(message, "Mail: gave up after 25 retries")
        (listed,) = store.messages()
        assert (listed.id, listed.failed_reason, listed.retries) == (
            message.id,
            "Mail: gave up after 25 retries",
            25,
        )
        assert [m.id for m in store.retry(driver)] == [message.id]
        assert store.messages() == []

    assert client.smembers(f"{namespace}-failed:hermes") == set()
    waiting = {MessageSerializer().unserialize(body).id for body in client.smembers(driver.key)}
    assert waiting == {queued.id, message.id}


def test_a_store_on_an_unreachable_redis_is_a_broker_error_naming_what_it_did(
    namespace: str,
) -> None:
    with (
        FailedStore.connect(f"redis://127.0.0.1:1/0?prefix={namespace}:") as store,
        pytest.raises(
            BrokerUnavailableError,
            match=f"key='{namespace}:hermes'>: unavailable while listing what waits",
        ),
    ):
        store.messages()
