"""Plugins (reward functions, interactions) may be written sync or `async def`, as verl accepts both."""

from __future__ import annotations

import asyncio
import inspect

__all__ = ["resolved"]


def resolved(value):
    """`value`, or what it resolves to when it is awaitable (a coroutine, task or future), run to completion on a
    fresh event loop in this thread. The callers run on worker threads without a loop of their own."""
    if not inspect.isawaitable(value):
        return value

    async def wait():
        return await value

    return asyncio.run(wait())
