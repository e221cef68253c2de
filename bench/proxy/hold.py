#!/usr/bin/python3
"""bench/proxy/hold.py: holds N client connections open on a proxy and reports the proxy's RSS
before and after, for scripts/bench-memory. Loopback only; everything bounded in time.

  idle    each connection completes one request (a non-streamed chat completion, so the proxy
          proxies it), then sits idle on keep-alive
  stream  each connection sends a streamed chat completion and holds it open mid-stream (the
          backend streams slowly); counted once every stream has received its first event

Before measuring, a few connections of the same kind warm the proxy up and are closed. Both
measurements wait for the RSS to settle: at least --settle-min seconds (an allocator returns freed
pages over time: kvgate's jemalloc decays them over 10 s, and kvgate parks an idle connection,
freeing all but its descriptor, after 1 s), then until 3 s of samples agree within max(256 KiB, 1%), at most
--settle-max seconds. Prints one line: "before_kib after_kib held".
"""
import argparse
import asyncio
import sys
import time

BODY_IDLE = b'{"model":"kvgate-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
BODY_STREAM = (b'{"model":"kvgate-sim","messages":[{"role":"user","content":"hi"}],'
               b'"max_tokens":20000,"stream":true}')


def request(port, body):
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (port, len(body)) + body)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


TRACE = False


async def settle(pid, least, most):
    """RSS once it has stopped moving (see the top of the file)."""
    start = time.monotonic()
    samples = []
    while True:
        now = time.monotonic() - start
        samples.append((now, rss_kib(pid)))
        if TRACE:
            print(f"hold: {now:6.2f} s RSS {samples[-1][1]} KiB", file=sys.stderr)
        window = [r for t, r in samples if t >= now - 3.0]
        if now >= max(least, 3.0) and max(window) - min(window) <= max(256, min(window) // 100):
            return samples[-1][1]
        if now >= most:
            print(f"hold: RSS of {pid} still moving after {most} s; taking the last sample",
                  file=sys.stderr)
            return samples[-1][1]
        await asyncio.sleep(0.25)


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length, chunked = None, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    return status, length, chunked


async def read_body(reader, length, chunked):
    if length is not None:
        await reader.readexactly(length)
        return
    if not chunked:
        raise RuntimeError("a keep-alive answer without a length")
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return


async def idle_conn(port, timeout):
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    writer.write(request(port, BODY_IDLE))
    status, length, chunked = await asyncio.wait_for(read_head(reader), timeout)
    await asyncio.wait_for(read_body(reader, length, chunked), timeout)
    if status != 200:
        raise RuntimeError(f"status {status}")
    return writer


async def stream_conn(port, timeout, drains):
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    writer.write(request(port, BODY_STREAM))
    status, _, _ = await asyncio.wait_for(read_head(reader), timeout)
    if status != 200:
        raise RuntimeError(f"status {status}")
    seen = b""
    while b"data:" not in seen:  # the first event
        chunk = await asyncio.wait_for(reader.read(4096), timeout)
        if not chunk:
            raise RuntimeError("closed before the first event")
        seen = seen[-8:] + chunk

    async def drain():  # a client reads what the stream sends
        try:
            while await reader.read(4096):
                pass
        except (ConnectionError, asyncio.CancelledError):
            pass

    drains.append(asyncio.ensure_future(drain()))
    return writer


async def open_many(args, n, drains):
    sem = asyncio.Semaphore(args.concurrency)

    async def one():
        async with sem:
            if args.mode == "idle":
                return await idle_conn(args.port, args.timeout)
            return await stream_conn(args.port, args.timeout, drains)

    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    writers = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        print(f"hold: {len(errors)} of {n} connections failed, e.g. {errors[0]!r}", file=sys.stderr)
    return writers


async def close_all(writers, drains):
    for d in drains:
        d.cancel()
    for w in writers:
        w.close()
    await asyncio.gather(*drains, return_exceptions=True)
    drains.clear()


async def main(args):
    drains = []
    warm = await open_many(args, args.warmup, drains)
    await close_all(warm, drains)
    before = await settle(args.pid, args.settle_min, args.settle_max)
    writers = await open_many(args, args.n, drains)
    after = await settle(args.pid, args.settle_min, args.settle_max)
    print(before, after, len(writers), flush=True)
    await asyncio.sleep(args.hold)  # for a profiler to look meanwhile
    await close_all(writers, drains)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["idle", "stream"], required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True, help="the process whose RSS is measured")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=64, help="connections being opened at once")
    p.add_argument("--timeout", type=float, default=30, help="per connect or read, seconds")
    p.add_argument("--settle-min", type=float, default=12, help="least wait before measuring, s")
    p.add_argument("--settle-max", type=float, default=30)
    p.add_argument("--deadline", type=float, default=180, help="whole run, seconds")
    p.add_argument("--hold", type=float, default=0, help="keep them this long after, s")
    p.add_argument("--trace", action="store_true", help="print every RSS sample to stderr")
    a = p.parse_args()
    TRACE = a.trace
    try:
        asyncio.run(asyncio.wait_for(main(a), a.deadline))
    except asyncio.TimeoutError:
        sys.exit(f"hold: not done within {a.deadline} s")
