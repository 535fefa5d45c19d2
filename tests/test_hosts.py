"""How a rank reaches a peer from what the peer said of itself (core/hosts.py): the
watchdog's heartbeats and collect mode's log lines both go by it."""
from core.hosts import LOOPBACK, addresses_to_reach, machine_identity


def test_a_peer_on_this_network_stack_is_reached_over_loopback_alone():
    assert addresses_to_reach(machine_identity(), ["10.0.0.1", "10.0.1.1"]) == [LOOPBACK]
    assert addresses_to_reach(machine_identity(), []) == [LOOPBACK]  # a host with no address but loopback's


def test_a_peer_elsewhere_is_reached_at_each_of_its_addresses():
    assert addresses_to_reach("another boot/another netns", ["10.0.0.2", "10.0.1.2"]) == ["10.0.0.2", "10.0.1.2"]
    # Without /proc no identity is known: only the peer's own addresses are trusted.
    assert addresses_to_reach(None, ["10.0.0.2"]) == ["10.0.0.2"]
