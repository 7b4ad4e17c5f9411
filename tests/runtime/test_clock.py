import trio
from pbkv.runtime import now_s


async def test_now_s_follows_the_virtual_clock(autojump_clock):
    start_s = now_s()
    await trio.sleep(12.5)
    assert now_s() - start_s == 12.5
    assert now_s() == trio.current_time()
