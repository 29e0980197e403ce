"""Priority queues named by the user: ``--queue NAME:P`` and a URL's ``priority_queues``."""

from __future__ import annotations

import pytest

from hermes.core import ConfigurationError, Message, UnknownPriorityError, compat, connect
from hermes.core.driver import DriverUrl
from hermes.core.spi._queues import parse_queue, parse_queues, url_queues, without_queues


def test_a_queue_is_a_name_and_the_priority_after_its_last_colon() -> None:
    assert parse_queue("hermes_high:200") == ("hermes_high", 200)
    assert parse_queue("app:hermes_low:-5") == ("app:hermes_low", -5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hermes_high", "must be NAME:PRIORITY"),
        (":200", "must be NAME:PRIORITY"),
        ("hermes_high:", "must be a whole number, got ''"),
        ("hermes_high:high", "must be a whole number, got 'high'"),
    ],
)
def test_a_queue_without_a_name_or_a_whole_priority_is_refused(text: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        parse_queue(text)


def test_a_priority_named_twice_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="names priority 200 twice: 'a' and 'b'"):
        parse_queues(["a:200", "b:200"], "--queue")


def test_one_name_for_two_priorities_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="gives queue 'a' two priorities: 200 and 50"):
        parse_queues(["a:200", "a:50"], "--queue")


def test_the_same_queue_given_twice_is_one_queue() -> None:
    assert parse_queues(["a:200", "a:200", "b:50"], "--queue") == {200: "a", 50: "b"}


def test_the_url_option_lists_queues_separated_by_commas() -> None:
    url = DriverUrl.parse("redis://localhost/0?priority_queues=hermes_high:200,hermes_low:50")

    assert url_queues(url) == {200: "hermes_high", 50: "hermes_low"}
    assert url_queues(DriverUrl.parse("redis://localhost/0")) == {}


def test_the_url_option_is_taken_out_before_the_driver_checks_its_own_options() -> None:
    url = DriverUrl.parse("redis://localhost/0?key=jobs&priority_queues=hermes_high:200")

    assert dict(without_queues(url).options) == {"key": "jobs"}


@pytest.mark.parametrize("value", ["", ",", "hermes_high"])
def test_a_bad_url_option_names_the_option_and_hides_the_password(value: str) -> None:
    url = DriverUrl.parse(f"redis://:s3cret@localhost/0?priority_queues={value}")

    with pytest.raises(ConfigurationError, match="priority_queues") as caught:
        url_queues(url)
    assert "s3cret" not in str(caught.value)


def test_connect_sets_up_the_queues_of_the_url(broker_name: str) -> None:
    with connect(f"memory://{broker_name}?priority_queues=high:200,low:50") as driver:
        driver.send(Message("job", id="h"), 200)
        driver.send(Message("job", id="l"), 50)
        compat.set_max_process_items(driver, 2)
        got: list[tuple[str, int]] = []
        compat.wait(driver, lambda message, priority: got.append((message.id, priority)) or True)
        driver.teardown()

    assert got == [("h", 200), ("l", 50)]


def test_without_the_option_those_priorities_are_unknown(broker_name: str) -> None:
    with connect(f"memory://{broker_name}") as driver, pytest.raises(UnknownPriorityError):
        driver.send(Message("job"), 200)


def test_connect_refuses_a_bad_option_before_building_the_driver() -> None:
    with pytest.raises(ConfigurationError, match="names priority 200 twice"):
        connect("memory://bad?priority_queues=a:200,b:200")
