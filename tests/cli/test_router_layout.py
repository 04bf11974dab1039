"""Where `sluice serve --router-processes N` puts its routers: all on the router's port, each also on a loopback port
of its own where the launcher checks it is ready."""
import subprocess

from sluice.cli.launcher import ServeLayout
from sluice.cli.python_command import sluice_command


def test_one_router_listens_on_the_router_port_alone():
    layout = ServeLayout.on_free_ports(router_port=50051)
    assert layout.router_processes == 1
    assert layout.router_listens == [layout.router_address]
    assert layout.router_process_addresses == [layout.router_address]


def test_several_routers_share_the_port_and_each_has_its_own():
    layout = ServeLayout.on_free_ports(router_port=50051, num_ranks=2, router_processes=3)
    own = [f"127.0.0.1:{port}" for port in layout.router_own_ports]
    assert layout.router_processes == 3 and len(set(own)) == 3
    assert layout.router_listens == [f"127.0.0.1:50051,{address}" for address in own]
    assert layout.router_process_addresses == own
    assert len(layout.worker_ports) == 2
    assert not {layout.scheduler_port, *layout.worker_ports} & set(layout.router_own_ports)


def test_zero_router_processes_is_refused():
    run = subprocess.run([*sluice_command(), "serve", "--router-processes", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--router-processes: must be at least 1, got 0" in run.stderr
