"""The owned-cache engine shell (engines/owned.py), driven through the sim engine."""

import dataclasses

import trio

from pbkv.engines.base import CallbackFailed
from pbkv.kvmanager import block_keys
from tests.engines.test_sim_engine import make_engine, prompt, request, running


async def test_an_on_token_that_raises_fails_its_request_alone(autojump_clock):
    engine = make_engine()
    seen: list[int] = []

    def faulty(token: int) -> bool:
        seen.append(token)
        raise KeyError("bad callback")

    results, failures = {}, {}
    async with running(engine):

        async def one(rid: str, base: int, on_token) -> None:
            req = request(rid, prompt(base), max_new_tokens=2)
            req = dataclasses.replace(req, on_token=on_token)
            try:
                results[rid] = await engine.generate(req)
            except CallbackFailed as error:
                failures[rid] = error

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "ok-1", 0, None)
            nursery.start_soon(one, "bad", 1000, faulty)
            nursery.start_soon(one, "ok-2", 2000, lambda t: False)
        again = await engine.generate(request("after", prompt(3000), max_new_tokens=2))
    assert sorted(results) == ["ok-1", "ok-2"]
    assert all(r.output_token_ids == (7, 8) for r in results.values())
    assert again.output_token_ids == (7, 8)
    assert seen == [7]  # ended at the token it raised on
    error = failures["bad"]
    assert str(error) == "request bad: on_token raised KeyError: 'bad callback'"
    assert isinstance(error.__cause__, KeyError) and not error.retryable
    engine.kv.check_integrity()
    assert engine.kv.tree.lease_count() == 0
    # what it computed stays cached, as at a normal end: the prompt's 31 full blocks
    cached = engine.kv.tree.match_prefix(block_keys(prompt(1000), 16))
    assert cached.gpu_blocks + cached.host_blocks == 31
