"""harness.process.free_port: ports for the operators and proxies the tests and the bench start."""

from __future__ import annotations

import socket

import pytest

from harness import process


def test_ports_are_outside_the_ephemeral_range_and_never_given_twice() -> None:
    ports = [process.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    ephemeral = process._ephemeral()
    assert not [p for p in ports if p in ephemeral], "a port an outgoing connection could take first"
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # and free when given


def test_a_port_something_listens_on_is_skipped_and_running_out_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        monkeypatch.setattr(process, "_ephemeral", lambda: range(0))
        monkeypatch.setattr(process, "_given", set())
        monkeypatch.setattr(process, "PORTS", range(busy, busy + 1))
        with pytest.raises(RuntimeError, match=f"no free TCP port in {busy}-{busy}"):
            process.free_port()
    assert process.free_port() == busy  # free once nothing listens there
    with pytest.raises(RuntimeError):
        process.free_port()  # never twice
