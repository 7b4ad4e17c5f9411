import pytest

from pbkv.kvmanager import KVConfig, KVManager


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float = 1.0) -> None:
        self.t += dt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_manager(clock, policy="pbkv", gpu=16, host=64, block_size=1, **kw) -> KVManager:
    cfg = KVConfig(
        block_size=block_size,
        gpu_capacity_blocks=gpu,
        host_capacity_blocks=host,
        bytes_per_block=kw.pop("bytes_per_block", 100),
        policy=policy,
        bandwidth_bytes_per_s=kw.pop("bandwidth_bytes_per_s", 1000.0),
        **kw,
    )
    return KVManager(cfg, clock)
