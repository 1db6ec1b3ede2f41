"""Sync and async plugin results resolve to the same value."""

import asyncio

from hybridrl.awaiting import resolved


class _Ready:
    """An awaitable that is not a coroutine (asyncio.run alone refuses it)."""

    def __await__(self):
        yield from asyncio.sleep(0).__await__()
        return 7


async def _coroutine():
    await asyncio.sleep(0)
    return 5


def test_values_coroutines_and_other_awaitables_resolve():
    assert resolved(3) == 3
    assert resolved(_coroutine()) == 5
    assert resolved(_Ready()) == 7
