"""The ports `sluice serve` and the tests hand to services stay bindable while outgoing connections come and go."""
import contextlib
import socket

from sluice.cli.launcher import _first_ephemeral_port, free_ports


def test_picked_ports_are_distinct_and_no_outgoing_connection_takes_one():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert not set(free_ports(500)) & set(ports)  # nor does a later pick, before the services bind them
    assert all(port < _first_ephemeral_port() for port in ports)
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.create_server(("127.0.0.1", 0), backlog=256))
        outgoing = [stack.enter_context(socket.create_connection(listener.getsockname())) for _ in range(200)]
        assert not {sock.getsockname()[1] for sock in outgoing} & set(ports)
        for port in ports:
            stack.enter_context(socket.create_server(("127.0.0.1", port)))


def test_a_run_of_ports_is_bindable_and_no_later_pick_lands_inside_it():
    starts = free_ports(3, run=4)
    runs = [set(range(start, start + 4)) for start in starts]
    assert len(set().union(*runs)) == 12
    assert not set(free_ports(500)) & set().union(*runs)
    with contextlib.ExitStack() as stack:
        for port in sorted(set().union(*runs)):
            stack.enter_context(socket.create_server(("127.0.0.1", port)))
