"""Runs that must not starve: a QUEUED run that has waited ``reserve_after``
seconds reserves the nodes it could use, so the runs behind it that fit no
longer take them as they free (SPEC 2c). On each engine, with the store's
clock stepped by the test."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

import store
from store.runs import waiting
from tests.helpers import Clock, trace

LEASE = 30.0
WAIT = 600.0
#: Four nodes: any of them runs a small run (linux); the big run needs one
#: step on each (a, b, c, d), so it needs all four free at once.
NODES = {"n1": "a", "n2": "b", "n3": "c", "n4": "d"}
#: Seconds each node takes over a small run: less than a lease, and unlike
#: the others', so the nodes never free together by chance.
TAKES = {"n1": 11.0, "n2": 13.0, "n3": 17.0, "n4": 19.0}
TICK = 1.0


def opened(location: str, reserve_after: float | None, clock: Clock) -> store.Store:
    db = store.open(location, lease_ttl=LEASE, reserve_after=reserve_after, clock=clock.time)
    for node_id, label in NODES.items():
        db.advertise(store.Advert(node_id, f"box-{node_id}", frozenset({"linux", label})))
    return db


def small() -> list[store.Step]:
    return [store.Step("work", "exec", frozenset({"linux"}))]


def big() -> list[store.Step]:
    return [store.Step(f"on-{label}", "exec", frozenset({label})) for label in NODES.values()]


@dataclass
class Stream:
    """An endless stream of small runs on the four nodes: each node works a
    step for its ``TAKES`` seconds, then reports it; the queue always holds
    a few small runs more."""

    db: store.Store
    clock: Clock
    #: What each node works on: ``(run_id, seq, done at)``.
    working: dict[str, tuple[str, int, float]] = field(default_factory=dict)
    small_runs: int = 0

    def top_up(self) -> None:
        while len(self.db.list_runs("QUEUED")) < 6:
            self.db.submit_run(small())
            self.small_runs += 1

    def step(self) -> None:
        """On to the next step's end (or a tick, if none is worked on): the
        steps done reported, idle nodes claim, the queue topped up."""
        ends = [done_at for _, _, done_at in self.working.values()]
        self.clock.tick(min(ends) - self.clock.now if ends else TICK)
        for node_id, (run_id, seq, done_at) in list(self.working.items()):
            if done_at <= self.clock.now:
                self.db.report_step(node_id, run_id, seq)
                del self.working[node_id]
        for node_id in NODES:
            if node_id not in self.working and (claim := self.db.claim_step(node_id)):
                self.working[node_id] = (claim.run_id, claim.seq, self.clock.now + TAKES[node_id])
        self.top_up()

    def run_until_started(self, run_id: str, seconds: float) -> float | None:
        """Step until the run leaves the queue; its start, or None if it
        still waits after ``seconds``."""
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.step()
            view = self.db.get_run(run_id)
            if view.state != "QUEUED":
                return view.started_at
        return None


@pytest.fixture
def stream(location: str, clock: Clock, request: pytest.FixtureRequest) -> Iterator[Stream]:
    with opened(location, request.param, clock) as db:
        s = Stream(db, clock)
        for _ in NODES:
            db.submit_run(small())
        s.step()
        assert len(s.working) == len(NODES), "every node starts on a small run"
        yield s


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stream", [WAIT], indirect=True)
def test_a_big_run_behind_a_stream_of_small_ones_starts_within_reserve_after_and_a_lease(
    stream: Stream,
) -> None:
    s = stream
    s.top_up()
    created = s.db.submit_run(big(), run_id="big").created_at
    started = s.run_until_started("big", WAIT + 4 * LEASE)
    assert started is not None, "the big run starved"
    assert WAIT <= started - created <= WAIT + LEASE
    # Until the big run had waited reserve_after, the small runs behind it
    # that fitted were placed (the note's scan); from then on none was.
    behind = [r.started_at for r in s.db.list_runs() if r.created_at > created and r.started_at]
    assert len(behind) > 100
    assert all(t < created + WAIT for t in behind)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stream", [None], indirect=True)
def test_without_reserve_after_the_queue_promotes_every_run_that_fits(stream: Stream) -> None:
    """The note's scan, exactly: the big run waits for ever while small runs
    behind it take each node as it frees."""
    s = stream
    s.top_up()
    s.db.submit_run(big(), run_id="big")
    before = s.small_runs
    assert s.run_until_started("big", 3 * WAIT) is None
    assert s.small_runs - before > 100
    assert s.db.explain("big")["reserving"] is False


# -- reservations, one event at a time ---------------------------------------


def test_a_starving_run_keeps_the_nodes_it_could_use_and_no_other(
    location: str, clock: Clock
) -> None:
    """A run that fits is placed on a free node a starving run could not use,
    but not on one it could; explain says which run reserves it."""
    with opened(location, 60.0, clock) as db:
        db.advertise(store.Advert("gpu1", "box-gpu1", frozenset({"gpu"})))
        holders = [db.submit_run(small()).run_id for _ in NODES]
        clock.tick(1)
        assert db.submit_run(big(), run_id="big").state == "QUEUED"
        clock.tick(59)
        db.submit_run(small(), run_id="young")  # behind big, waits too
        assert db.explain("big")["reserving"] is False
        clock.tick(1)
        assert db.explain("big")["reserving"] is True
        assert db.explain("young")["reserving"] is False

        node_id = db.get_run(holders[0]).steps[0].node
        claim = db.claim_step(node_id)
        assert claim is not None
        db.report_step(node_id, claim.run_id, claim.seq)
        assert db.get_run("young").state == "QUEUED", "a reserved node was given away"
        assert db.submit_run(small(), run_id="later").state == "QUEUED"
        gpu = db.submit_run([store.Step("train", "exec", frozenset({"gpu"}))], run_id="gpu")
        assert gpu.state == "RUNNING", "a node the starving run cannot use is not reserved"

        why = db.explain("young")
        assert why["position"] == 2
        (step,) = why["steps"]
        free = [n for n in step["nodes"] if n["node_id"] == node_id]
        assert free == [
            {"node_id": node_id, "name": f"box-{node_id}", "why": "reserved", "run_id": "big"}
        ]
        # The starving run itself sees the node free.
        mine = [
            n for s in db.explain("big")["steps"] for n in s["nodes"] if n["node_id"] == node_id
        ]
        assert mine == [{"node_id": node_id, "name": f"box-{node_id}", "why": None}]


def test_the_oldest_starving_run_goes_first(location: str, clock: Clock) -> None:
    """Two starving runs that want the same node: the later one does not
    take it while the first waits for the rest of its nodes."""
    with opened(location, 10.0, clock) as db:
        holders = [db.submit_run(small()).run_id for _ in NODES]
        clock.tick(1)
        db.submit_run(big(), run_id="big")
        db.submit_run([store.Step("s", "exec", frozenset({"a"}))], run_id="on-a")
        clock.tick(11)
        assert db.explain("on-a")["reserving"] is True
        for run_id in holders[:3]:
            (node_id,) = {s.node for s in db.get_run(run_id).steps}
            claim = db.claim_step(node_id)
            assert claim is not None
            db.report_step(node_id, claim.run_id, claim.seq)
        assert db.get_run("on-a").state == "QUEUED"
        (node_id,) = {s.node for s in db.get_run(holders[3]).steps}
        assert db.cancel_run(holders[3])
        assert db.get_run("big").state == "RUNNING"
        assert db.get_run("on-a").state == "QUEUED"


def test_reserve_after_zero_is_strict_fifo(location: str, clock: Clock) -> None:
    """Every QUEUED run reserves at once, even in the instant it was
    submitted (the clock does not move here)."""
    with opened(location, 0.0, clock) as db:
        holders = [db.submit_run(small()).run_id for _ in NODES]
        db.submit_run(big(), run_id="big")
        assert db.cancel_run(holders[0])
        assert db.submit_run(small()).state == "QUEUED"
        assert db.explain("big")["reserving"] is True


def test_reserve_after_is_a_setting_of_each_open_store(location: str, clock: Clock) -> None:
    """Like ``lease_ttl``: a handle without it places as the note's scan does."""
    with (
        opened(location, 5.0, clock) as reserving,
        store.open(location, reserve_after=None, clock=clock.time) as plain,
    ):
        holders = [reserving.submit_run(small()).run_id for _ in NODES]
        clock.tick(1)
        reserving.submit_run(big(), run_id="big")
        clock.tick(5)
        assert reserving.cancel_run(holders[0])
        assert reserving.submit_run(small()).state == "QUEUED"
        assert plain.submit_run(small()).state == "RUNNING"
        assert plain.reserve_after is None and reserving.reserve_after == 5.0


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("600", TypeError),
        (True, TypeError),
        (-1.0, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
    ],
)
def test_reserve_after_must_be_seconds_or_none(
    tmp_path: object, value: object, error: type
) -> None:
    with pytest.raises(error, match="reserve_after"):
        store.open(f"{tmp_path}/x.sqlite3", reserve_after=value)  # type: ignore[arg-type]


def test_the_default_is_ten_minutes(tmp_path: object) -> None:
    with store.open(f"{tmp_path}/x.sqlite3") as db:
        assert db.reserve_after == 600.0


def test_a_long_backlog_of_waiting_runs_is_read_once_not_at_every_submit(
    location: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs that waited long (a GPU backlog, say) cost a submit that does not
    fit nothing, and one that fits a look for runs that have waited long
    enough since the last submit: the backlog is read again only once a run
    left the queue."""
    with opened(location, 0.0, clock) as db:
        for i in range(4):
            db.advertise(store.Advert(f"x{i}", f"box-x{i}", frozenset({"linux"})))
        db.advertise(store.Advert("gpu1", "box-gpu1", frozenset({"gpu"})))
        gpu = [store.Step("train", "exec", frozenset({"gpu"}))]
        db.submit_run(gpu, run_id="training")
        seen = trace(db, monkeypatch)

        def pages() -> int:
            """The pages of the waiting line read since ``seen`` was cleared."""
            read = sum(sql.startswith("SELECT r.id, r.created_at") for sql in seen)
            seen.clear()
            return read

        for i in range(3 * waiting.PAGE):
            assert db.submit_run(gpu, run_id=f"gpu-{i}").state == "QUEUED"  # gpu1 is busy
        assert pages() == 0

        assert db.submit_run(small()).state == "RUNNING"
        assert pages() == 3 + 1  # the whole backlog, to its end
        for _ in range(3):
            assert db.submit_run(small()).state == "RUNNING"
            assert pages() == 1  # nothing waited long enough since
        assert db.cancel_run("gpu-0")
        pages()  # (the wake that follows a cancel scans the queue, as ever)
        assert db.submit_run(small()).state == "RUNNING"
        assert pages() == 3 + 1  # read again: a run left the queue


def test_a_run_that_could_never_start_reserves_nothing(location: str, clock: Clock) -> None:
    """A run no placement exists for any more (a node it needs was advertised
    again without the label) would otherwise hold its nodes for ever."""
    with opened(location, 60.0, clock) as db:
        holders = [db.submit_run(small()).run_id for _ in NODES]
        clock.tick(1)
        assert db.submit_run(big(), run_id="big").state == "QUEUED"
        db.advertise(store.Advert("n4", "box-n4", frozenset({"linux"})))  # no "d" any more
        clock.tick(60)
        assert db.explain("big")["reserving"] is False
        assert db.cancel_run(holders[0])
        assert db.submit_run(small(), run_id="small").state == "RUNNING"
        # With the label back, it reserves again.
        db.advertise(store.Advert("n4", "box-n4", frozenset({"linux", "d"})))
        assert db.explain("big")["reserving"] is True
        assert db.cancel_run(holders[1])
        assert db.submit_run(small()).state == "QUEUED"


def test_a_reserving_run_cancelled_holds_nothing_back(location: str, clock: Clock) -> None:
    """What a store keeps of the reservations is read again once a run left
    the queue: the nodes a cancelled run reserved are free to take at once."""
    with opened(location, 0.0, clock) as db:
        db.advertise(store.Advert("gpu1", "box-gpu1", frozenset({"gpu"})))
        gpu = [store.Step("train", "exec", frozenset({"gpu"}))]
        holders = [db.submit_run(small()).run_id for _ in NODES]
        assert db.submit_run(big(), run_id="big").state == "QUEUED"
        assert db.cancel_run(holders[0])  # its node stays free: big reserves it
        assert db.submit_run(gpu).state == "RUNNING"  # reads the reservations
        assert db.cancel_run("big")  # nothing is queued: the wake places nothing
        assert db.submit_run(small()).state == "RUNNING"
