"""owner_id: the id a consumer writes where it holds messages."""

from __future__ import annotations

import os
import socket

from hermes.core.drivertools import owner_id


def test_an_owner_id_names_the_host_and_the_process_and_is_new_each_time() -> None:
    first, second = owner_id(), owner_id()
    host, pid, random = first.rsplit(":", 2)

    assert host == socket.gethostname() and pid == str(os.getpid())
    assert len(random) == 8 and int(random, 16) >= 0
    assert first != second


def test_a_forked_child_gets_ids_of_its_own_pid() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, owner_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    os.close(read)

    assert child.split(":")[-2] == str(pid)
