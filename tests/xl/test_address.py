"""``host:port`` written one way and read back the way the ranks read XL_COLLECTOR."""

from __future__ import annotations

from xl.address import LOOPBACK, format_address, split_address


def test_what_format_address_writes_reads_back() -> None:
    for host, port in [("node0", 29500), ("10.0.0.1", 1), ("fd00::1", 29501)]:
        assert split_address(format_address(host, port)) == (host, port)


def test_a_damaged_address_reads_as_nowhere_to_send_not_an_error() -> None:
    assert split_address("") == (LOOPBACK, 0)
    assert split_address("node0:http") == ("node0", 0)
    assert split_address(":29500") == (LOOPBACK, 29500)
