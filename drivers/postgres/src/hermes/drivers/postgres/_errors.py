"""What a psycopg exception means to Hermes: refused, unavailable, or another failure.

PostgreSQL says why in a SQLSTATE. A failed query carries it
(``exc.sqlstate``); a failed *connection attempt* does not -- libpq keeps
only the server's message text then -- so for those the message's FATAL
line is read. PostgreSQL writes it in the server's ``lc_messages``
language; on a server localized to another language a refused login reads
as "unavailable" and the worker keeps retrying instead of exiting.
"""

from __future__ import annotations

import psycopg
import psycopg_pool

from hermes.core import BrokerRefusedError, BrokerUnavailableError, DriverError
from hermes.core.drivertools import CertificateRefusedError

#: Trying again cannot help: credentials, a database or role that does not
#: exist, a missing permission, a table missing where ``create=false``.
REFUSED_SQLSTATES = frozenset(
    {
        "28000",  # invalid_authorization_specification: no such role, no pg_hba.conf entry
        "28P01",  # invalid_password
        "3D000",  # invalid_catalog_name: no such database
        "3F000",  # invalid_schema_name
        "42501",  # insufficient_privilege
        "42P01",  # undefined_table: the tables were not created (create=false)
    }
)
#: The server went away or cannot take this client now: a worker backs off and retries.
UNAVAILABLE_SQLSTATE_CLASSES = frozenset({"08", "53", "57"})  # connection, resources, operator
UNAVAILABLE_SQLSTATES = frozenset({"40001", "40P01", "55P03"})  # serialization, deadlock, lock

#: The FATAL lines of a refused connection attempt, which carries no SQLSTATE.
_REFUSED_LOGIN_TEXTS = (
    "password authentication failed",
    "does not exist",  # role "x" / database "x"
    "no pg_hba.conf entry",
    "permission denied",
    "not permitted to log in",
)


#: What libpq says, beyond OpenSSL's "certificate verify failed", when the
#: server's certificate does not name the host, or no CA can verify it.
_TLS_TEXTS = (
    "does not match host name",
    "root certificate file",  # sslrootcert names no readable file
)


def classify(exc: BaseException) -> type[DriverError] | None:
    """The Hermes error ``exc`` means, or None when it is not psycopg's."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return BrokerUnavailableError
    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate
    if state is not None:
        if state in REFUSED_SQLSTATES:
            return BrokerRefusedError
        if state[:2] in UNAVAILABLE_SQLSTATE_CLASSES or state in UNAVAILABLE_SQLSTATES:
            return BrokerUnavailableError
        return DriverError
    if isinstance(exc, psycopg.OperationalError):
        if CertificateRefusedError.in_chain(exc, texts=_TLS_TEXTS):
            # Retrying cannot make a certificate verify: the URL or the server must change.
            return CertificateRefusedError
        text = str(exc)
        if "FATAL:" in text and any(refused in text for refused in _REFUSED_LOGIN_TEXTS):
            return BrokerRefusedError
        # Refused or reset sockets, timeouts, "the connection is closed".
        return BrokerUnavailableError
    if isinstance(exc, psycopg.InterfaceError):
        # Raised on a connection psycopg already knows is closed.
        return BrokerUnavailableError
    return DriverError
