import trio

from pbkv.runtime import now_s, seed_scheduler


async def test_now_s_follows_the_virtual_clock(autojump_clock):
    start_s = now_s()
    await trio.sleep(12.5)
    assert now_s() - start_s == 12.5
    assert now_s() == trio.current_time()


def _task_order(seed: int) -> list[int]:
    seed_scheduler(seed)
    order: list[int] = []

    async def worker(index: int) -> None:
        for _ in range(3):
            await trio.sleep(0)
            order.append(index)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for index in range(6):
                nursery.start_soon(worker, index)

    trio.run(main)
    return order


def test_seed_scheduler_makes_task_order_reproducible():
    first = _task_order(7)
    assert sorted(first) == [index for index in range(6) for _ in range(3)]
    assert _task_order(7) == first
    assert _task_order(8) != first  # the seed, not luck, fixes the order
