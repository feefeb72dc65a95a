"""The reference server's compute model (`reference/batching.py`), on a fake clock: the waits
it asks for, and which requests share a batch, without sleeping."""

import asyncio

import pytest

from libero_eval.reference.batching import BatchSlot


class FakeTime:
    """A clock that moves only when the slot sleeps; each sleep waits for the test's release."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []
        self.release = asyncio.Semaphore(0)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        await self.release.acquire()
        self.now += seconds


async def inline(compute):
    return compute()


def slot(fake: FakeTime, max_batch_size: int = 8) -> BatchSlot:
    return BatchSlot(0.5, 0.25, max_batch_size, clock=fake.clock, sleep=fake.sleep, offload=inline)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_latency_is_fixed_plus_per_item_times_the_batch():
    assert BatchSlot(0.5, 0.25, 8).latency_s(3) == pytest.approx(1.25)
    assert BatchSlot(0.0, 0.0, 1).latency_s(8) == 0.0


def test_two_concurrent_batch_requests_are_served_one_after_the_other():
    async def scenario():
        fake = FakeTime()
        batches, computed = slot(fake), []
        first = asyncio.create_task(batches.run(lambda: computed.append("a") or "A", 2))
        second = asyncio.create_task(batches.run(lambda: computed.append("b") or "B", 4))
        await settle()
        # the first batch computes and waits out its latency; the second has not started
        assert computed == ["a"] and fake.waits == [1.0]
        fake.release.release()
        await settle()
        assert first.done() and not second.done()
        assert computed == ["a", "b"] and fake.waits == [1.0, 1.5]
        fake.release.release()
        a, b = await first, await second
        assert (a.value, a.batch_size, a.latency_s, a.queued_s) == ("A", 2, 1.0, 0.0)
        assert (b.value, b.batch_size, b.latency_s, b.queued_s) == ("B", 4, 1.5, 1.0)
        assert (batches.batches, batches.requests, batches.items) == (2, 2, 6)
        assert batches.busy_s == 2.5 and batches.queue_wait_s == 1.0

    asyncio.run(scenario())


def test_single_observation_requests_arriving_during_a_batch_are_merged_into_the_next():
    async def scenario():
        fake = FakeTime()
        batches = slot(fake, max_batch_size=2)
        first = asyncio.create_task(batches.run_merged(lambda: "x"))
        await settle()
        assert fake.waits == [0.75]  # alone at an idle slot: at once, batch of 1
        later = [asyncio.create_task(batches.run_merged(lambda v=v: v)) for v in "yzw"]
        await settle()
        assert fake.waits == [0.75]  # they wait for the batch in flight
        for _ in range(3):
            fake.release.release()
            await settle()
        # y and z merged into one batch of 2 (the max), w into the one after
        assert fake.waits == [0.75, 1.0, 0.75]
        x, y, z, w = [await t for t in (first, *later)]
        assert [r.value for r in (x, y, z, w)] == ["x", "y", "z", "w"]
        assert [r.batch_size for r in (x, y, z, w)] == [1, 2, 2, 1]
        assert (y.queued_s, z.queued_s, w.queued_s) == (0.75, 0.75, 1.75)
        assert (batches.batches, batches.requests, batches.items) == (3, 4, 4)

    asyncio.run(scenario())


def test_a_failing_request_fails_alone_in_its_merged_batch():
    async def scenario():
        fake = FakeTime()
        batches = slot(fake)
        first = asyncio.create_task(batches.run_merged(lambda: "x"))
        await settle()

        def boom():
            raise ValueError("bad item")

        bad = asyncio.create_task(batches.run_merged(boom))
        good = asyncio.create_task(batches.run_merged(lambda: "ok"))
        await settle()
        fake.release.release()
        fake.release.release()
        assert (await first).value == "x"
        with pytest.raises(ValueError, match="bad item"):
            await bad
        assert (await good).batch_size == 2

    asyncio.run(scenario())


def test_a_computation_slower_than_the_model_adds_no_wait():
    async def scenario():
        fake = FakeTime()

        def slow():
            fake.now += 5.0
            return "done"

        timed = await slot(fake).run(slow, 1)
        assert fake.waits == [] and timed.latency_s == 5.0

    asyncio.run(scenario())
