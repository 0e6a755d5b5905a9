"""A stop request names the attempt (epoch) it applies to, and a restarted attempt honours it; the
controller's lease in the run store: one holder, takeover only of an expired lease."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from trainer.runstore.lease import Lease, LeaseHeld, LeaseLost
from trainer.runstore.store import RunStore
from trainer.stops.interruptions import (
    newest_epoch,
    request_in_force,
    request_stop,
    stop_reason,
    withdraw_stop,
)
from trainer.stops.stop_request import StopRequestWatcher


class Flag:
    def __init__(self) -> None:
        self.reason: str | None = None

    def set(self, reason: str) -> None:
        self.reason = reason

    def is_set(self) -> bool:
        return self.reason is not None


def test_a_restarted_attempt_honours_a_request_made_for_the_one_before(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.claim_epoch({"attempt": 1})
    request_stop(store, "policy switch to on-demand", epoch=newest_epoch(store))
    # the trainer exits 75 and SkyPilot restarts it before the controller cancels (a laptop asleep)
    restarted = RunStore(str(tmp_path / "run"))
    watcher = StopRequestWatcher(Flag(), restarted, poll_s=1)  # starts after the request was made
    assert not watcher.check()  # before its epoch claim: only requests made since it started
    restarted.claim_epoch({"attempt": 2})
    assert watcher.check() and watcher.flag.reason == "controller: policy switch to on-demand"
    withdraw_stop(store)  # the switch is done: the next attempt trains
    assert stop_reason(restarted, since=0.0) is None


def test_a_request_without_an_epoch_keeps_the_time_rule_and_one_expires(tmp_path: Path) -> None:
    at = 1000.0
    assert not request_in_force({"reason": "cancel", "at": at - 1}, since=at, epoch=3)
    assert request_in_force({"reason": "cancel", "at": at + 1}, since=at, epoch=3)
    named = {"reason": "switch", "at": at - 50, "epoch": 2, "expires_at": at + 10}
    assert request_in_force(named, since=at, epoch=3, now=at)
    assert not request_in_force(named, since=at, epoch=3, now=at + 10)  # expired: train again
    assert not request_in_force({**named, "epoch": 4}, since=at, epoch=3, now=at)  # a later attempt's


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_lease_has_one_holder_and_is_taken_over_only_once_expired(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    clock = FakeClock()
    first = Lease(store, "laptop (pid 1)", ttl_s=300, clock=clock)
    second = Lease(store, "server (pid 2)", ttl_s=300, clock=clock)
    assert first.acquire() == 1
    with pytest.raises(LeaseHeld, match="held by laptop"):
        second.acquire()
    clock.now = 200
    first.renew()
    clock.now = 450  # renewed at 200: still held
    with pytest.raises(LeaseHeld):
        second.acquire()
    clock.now = 8 * 3600  # the laptop slept: the lease expired, the server takes it over
    assert second.acquire() == 2
    with pytest.raises(LeaseLost):
        first.renew()  # the laptop wakes: it must not act
    second.release()
    assert Lease(store, "third", 300, clock).acquire() == 3  # released: no wait


def test_two_controllers_started_at_once_get_one_lease(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    results: list[str] = []
    barrier = threading.Barrier(8)

    def take(n: int) -> None:
        barrier.wait()
        try:
            Lease(RunStore(str(tmp_path / "run")), f"c{n}", ttl_s=300).acquire()
            results.append("won")
        except LeaseHeld:
            results.append("held")

    threads = [threading.Thread(target=take, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("won") == 1, results
    assert Lease(store, "x", 300).current().generation == 1
