#!/usr/bin/env python3
"""A Service-like TCP round-robin: each new connection goes to the next backend.

    rr-proxy.py LISTEN_PORT BACKEND_PORT [BACKEND_PORT...]

TLS passes through untouched (the backends terminate it), as with kube-proxy.
"""
import asyncio
import itertools
import sys


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main():
    listen = int(sys.argv[1])
    backends = itertools.cycle(int(p) for p in sys.argv[2:])

    async def handle(client_r, client_w):
        try:
            backend_r, backend_w = await asyncio.open_connection("127.0.0.1", next(backends))
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, backend_w), pipe(backend_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


asyncio.run(main())
