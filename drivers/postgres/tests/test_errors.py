"""What the server's refusals and outages mean: refused stops a worker, unavailable is retried."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from hermes.core import BrokerRefusedError, BrokerUnavailableError, DriverError, Message, connect
from hermes.core.spi._door import translate_errors
from hermes.drivers.postgres._errors import classify

HERMES = Path(sys.executable).with_name("hermes")


def with_database(url: str, database: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + database


@pytest.fixture
def role(sql):
    """A login role of the test's own, with a password and no privileges; dropped after."""
    name = f"hermes_test_{uuid.uuid4().hex[:8]}"
    sql.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'right'")
    yield name
    sql.execute(f"DROP ROLE IF EXISTS {name}")


def test_a_missing_database_is_refused_with_the_password_masked(postgres_url, table):
    url = with_database(postgres_url, "hermes_no_such_db").replace("postgres@", "postgres:s3cret@")
    driver = connect(f"{url}?table={table}")
    with pytest.raises(BrokerRefusedError, match="does not exist") as caught:
        driver.send(Message("x"))
    assert "s3cret" not in str(caught.value)


def test_a_missing_role_is_refused(postgres_url, table):
    url = postgres_url.replace("postgres@", f"hermes_nobody_{uuid.uuid4().hex[:6]}@")
    consumer = connect(f"{url}?table={table}").consumer(())
    with pytest.raises(BrokerRefusedError):
        with translate_errors(consumer.driver, "receiving"):  # what core wraps receive in
            consumer.receive(0.1)


def test_a_wrong_password_is_refused(postgres_url, table, role):
    url = postgres_url.replace("postgres@", f"{role}:wrong@")
    try:
        psycopg.connect(url).close()
    except psycopg.OperationalError:
        pass
    else:
        pytest.skip("this server trusts 127.0.0.1 (pg_hba.conf): it checks no password")
    with pytest.raises(BrokerRefusedError, match="password"):
        connect(f"{url}?table={table}").send(Message("x"))


def test_a_role_without_privilege_on_the_schema_is_refused(postgres_url, table, role):
    # PostgreSQL 15 and later grant no CREATE on schema public to ordinary roles.
    url = postgres_url.replace("postgres@", f"{role}:right@")
    with pytest.raises(BrokerRefusedError, match="permission denied"):
        connect(f"{url}?table={table}").send(Message("x"))


def test_nothing_listening_is_unavailable():
    driver = connect("postgresql://postgres@127.0.0.1:1/test?connect_timeout=1")
    with pytest.raises(BrokerUnavailableError):
        driver.send(Message("x"))


@pytest.mark.parametrize(
    ("sqlstate", "meaning"),
    [
        ("28P01", BrokerRefusedError),
        ("28000", BrokerRefusedError),
        ("3D000", BrokerRefusedError),
        ("42501", BrokerRefusedError),
        ("57P01", BrokerUnavailableError),
        ("08006", BrokerUnavailableError),
        ("53300", BrokerUnavailableError),
        ("22P02", DriverError),
    ],
)
def test_a_sqlstate_decides_what_an_error_means(sqlstate, meaning):
    error = psycopg.errors.lookup(sqlstate)("boom")
    assert error.sqlstate == sqlstate
    assert classify(error) is meaning


def test_an_exception_of_another_library_is_not_classified():
    assert classify(ValueError("x")) is None


def test_hermes_worker_on_a_missing_database_exits_2_with_one_line(postgres_url, table, tmp_path):
    (tmp_path / "jobs.py").write_text("HANDLERS = {'noop': lambda message: True}\n")
    url = with_database(postgres_url, "hermes_no_such_db").replace("postgres@", "postgres:s3cret@")
    done = subprocess.run(
        [str(HERMES), "worker", "--url", f"{url}?table={table}", "--handlers", "jobs:HANDLERS"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "does not exist" in last
    assert "s3cret" not in done.stderr
