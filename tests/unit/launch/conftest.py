"""The launch tests' CSVs name made-up hosts (n1, n2, node-1.example.lan ...). Checking a CSV
resolves the hosts that share a port (`workers_csv.resolve`): over this network's DNS a made-up
name comes back unknown, but now and then only after the resolver's 5-s retry. These tests are
about the plans, not the DNS: here a name other than localhost is unknown at once, as DNS would
say, and addresses resolve as always. Tests of the resolution itself patch `getaddrinfo` over
this one."""

import ipaddress
import socket

import pytest

_real_getaddrinfo = socket.getaddrinfo


def _getaddrinfo(host, *args, **kwargs):
    try:
        ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        if host != "localhost":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
    return _real_getaddrinfo(host, *args, **kwargs)


@pytest.fixture(autouse=True)
def _made_up_hosts_are_unknown_at_once(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _getaddrinfo)
