"""Who may see the dashboard: HTTP Basic, a token, and which addresses need either."""

from __future__ import annotations

import base64

import pytest

from hermes.dashboard import Auth
from hermes.dashboard._cli import is_loopback


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_credentials_must_match_both_user_and_password() -> None:
    auth = Auth("ops", "s3cret")
    assert auth.allows(basic("ops", "s3cret"))
    assert not auth.allows(basic("ops", "wrong"))
    assert not auth.allows(basic("other", "s3cret"))
    assert not auth.allows(None)
    assert not auth.allows("Basic !!!not-base64")
    assert not auth.allows("Bearer s3cret"), "a password is not a token"


def test_a_token_is_accepted_as_bearer_or_as_the_basic_password() -> None:
    auth = Auth(token="t0ken")
    assert auth.allows("Bearer t0ken")
    assert auth.allows(basic("anyone", "t0ken"))
    assert not auth.allows("Bearer nope")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("dashboard.example.com", False),
    ],
)
def test_only_loopback_addresses_are_served_without_auth(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
