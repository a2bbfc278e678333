"""AwaitableCondition: coroutines wait on a threaded core's condition without a thread each."""

import asyncio
import threading

from zerobubble.common.conditions import AwaitableCondition


def test_coroutines_wake_on_a_notify_from_a_thread_and_hold_no_threads():
    cond = AwaitableCondition()
    items: list[int] = []

    def producer():
        for i in range(1000):
            with cond:
                items.append(i)
                cond.notify()  # one notify wakes every coroutine: each re-checks its predicate

    async def waiter(i: int) -> int:
        return await cond.wait_for_async(lambda: len(items) > i and items[i] + 1, timeout=60)

    async def main():
        tasks = [asyncio.create_task(waiter(i)) for i in range(1000)]
        await asyncio.sleep(0.1)
        threads_while_waiting = threading.active_count()
        threading.Thread(target=producer).start()
        return threads_while_waiting, await asyncio.gather(*tasks)

    before = threading.active_count()
    threads_while_waiting, results = asyncio.run(main())
    assert threads_while_waiting <= before  # a thread each would add a thousand; other tests' may end meanwhile
    assert results == [i + 1 for i in range(1000)]
    assert not cond._coroutine_waiters


def test_threads_wait_on_it_as_before_and_a_timeout_gives_the_predicates_last_value():
    cond = AwaitableCondition()
    seen: list = []

    def thread_waiter():
        with cond:
            seen.append(cond.wait_for(lambda: "go" in seen, timeout=30))

    waiter = threading.Thread(target=thread_waiter)
    waiter.start()
    assert asyncio.run(cond.wait_for_async(lambda: "go" in seen, timeout=0.05)) is False
    with cond:
        seen.append("go")
        cond.notify_all()
    waiter.join(30)
    assert seen == ["go", True]
