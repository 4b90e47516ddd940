#!/usr/bin/env python3
"""P4: N GETs + JSON parse from Python asyncio, C at a time.

  py_bench.py fetchq|aiohttp|httpx URL N C

fetchq goes through the binding (bindings/python, AsyncEngine: poll delivery
on the loop's thread): all N requests submitted to a queue of max_concurrent
C, "parse": "json", "coalesce": false (the binding adds "lazy_parse": the
engine checks each body, json() parses it in Python); each response's parsed
value is read as a Python object when it completes. aiohttp and httpx run C worker coroutines over one client with C
connections, each awaiting response.json(). Every URL is distinct (?i=k).
The time runs from creating the engine or client session to the last
response. Before it starts, each client's module is imported and one engine
or client is created and closed (`warm_up`): one-time costs of the process
(imports, native libraries) stay out of the run for all three.
Prints one JSON object on stdout; a failed request is an error.
"""
import asyncio
import json
import sys
import time


async def run_fetchq(url: str, n: int, c: int) -> None:
    import fetchq  # imported before the clock starts (main)
    async with fetchq.AsyncEngine(max_per_host=c) as engine:
        q = engine.queue("p4", max_concurrent=c)
        # Each response is checked as it completes and then dropped, as the
        # aiohttp and httpx workers do: holding all N parsed documents until
        # the end would make Python's cyclic GC scan them over and over
        # (bench/findings.md, "Fifth round").
        all_done = asyncio.get_running_loop().create_future()
        left = n

        def check(fut: "asyncio.Future[fetchq.Response]") -> None:
            nonlocal left
            try:
                r = fut.result()
                if r.status != 200 or "items" not in r.json():
                    raise SystemExit(f"py_bench fetchq: bad response {r.status}")
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                if not all_done.done():
                    all_done.set_exception(e)
                return
            left -= 1
            if left == 0:
                all_done.set_result(None)

        for i in range(n):
            q.request("GET", f"{url}?i={i}", parse="json", coalesce=False).add_done_callback(check)
        await all_done


async def run_aiohttp(url: str, n: int, c: int) -> None:
    import aiohttp  # imported before the clock starts (main)
    counter = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as session:
        async def worker() -> None:
            for i in counter:
                async with session.get(f"{url}?i={i}") as r:
                    d = await r.json()
                    if r.status != 200 or "items" not in d:
                        raise SystemExit(f"py_bench aiohttp: bad response {r.status}")
        await asyncio.gather(*(worker() for _ in range(c)))


async def run_httpx(url: str, n: int, c: int) -> None:
    import httpx  # imported before the clock starts (main)
    counter = iter(range(n))
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(limits=limits) as client:
        async def worker() -> None:
            for i in counter:
                r = await client.get(f"{url}?i={i}")
                if r.status_code != 200 or "items" not in r.json():
                    raise SystemExit(f"py_bench httpx: bad response {r.status_code}")
        await asyncio.gather(*(worker() for _ in range(c)))


async def warm_up(client: str) -> None:
    """Creates and closes one engine or client, with no request: what the
    first one loads once per process, the timed run's one finds loaded.
    aiohttp loads its C parts when imported; the binding loads libfetchq
    (with libcurl and the libraries they need: 6-13 ms here) when the first
    engine is made; httpx imports anyio and httpcore (137 modules, about
    90 ms here) when the first client is made (bench/findings.md, "Tenth
    round")."""
    if client == "fetchq":
        import fetchq
        async with fetchq.AsyncEngine():
            pass
    elif client == "aiohttp":
        import aiohttp
        async with aiohttp.ClientSession():
            pass
    else:
        import httpx
        async with httpx.AsyncClient():
            pass


def main() -> None:
    if len(sys.argv) != 5 or sys.argv[1] not in ("fetchq", "aiohttp", "httpx"):
        raise SystemExit("usage: py_bench.py fetchq|aiohttp|httpx URL N C")
    client, url, n, c = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fn = {"fetchq": run_fetchq, "aiohttp": run_aiohttp, "httpx": run_httpx}[client]
    # The client's module is imported before the clock starts, for all three:
    # importing is a one-time cost of the process, not of the requests (it was
    # 120-150 ms for aiohttp and 45 ms for fetchq here, 10-20 % of a run of
    # 10 000 requests; bench/findings.md, "Seventh round"). So is what the
    # first engine or client loads (warm_up). Creating the session or engine
    # stays inside the timed run.
    __import__(client)
    asyncio.run(warm_up(client))
    t0 = time.monotonic()
    asyncio.run(fn(url, n, c))
    t = time.monotonic() - t0
    print(json.dumps({"bench": "p4", "client": client, "n": n, "concurrency": c,
                      "seconds": round(t, 6), "rate": round(n / t, 3)}))


if __name__ == "__main__":
    main()
