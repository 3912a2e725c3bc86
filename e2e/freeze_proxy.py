#!/usr/bin/env python3
"""A TCP proxy that stalls connections: on SIGUSR1 every connection open at that moment
stops moving bytes (both ways) but stays open, as a watch through a hung load balancer
does; connections made afterwards pass. SIGUSR2 lets the stalled ones go again.

    e2e/freeze_proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT
"""
import asyncio
import signal
import sys

conns = {}  # id -> asyncio.Event set while the connection may move bytes
next_id = 0


async def pump(reader, writer, gate):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await gate.wait()
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def handle(client_r, client_w, host, port):
    global next_id
    next_id += 1
    cid = next_id
    gate = asyncio.Event()
    gate.set()
    conns[cid] = gate
    try:
        server_r, server_w = await asyncio.open_connection(host, port)
    except OSError:
        client_w.close()
        conns.pop(cid, None)
        return
    await asyncio.gather(pump(client_r, server_w, gate), pump(server_r, client_w, gate))
    conns.pop(cid, None)


def freeze():
    for gate in conns.values():
        gate.clear()
    print(f"froze {len(conns)} connection(s)", flush=True)


def thaw():
    for gate in conns.values():
        gate.set()
    print("thawed", flush=True)


async def main():
    listen, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, freeze)
    loop.add_signal_handler(signal.SIGUSR2, thaw)
    server = await asyncio.start_server(lambda r, w: handle(r, w, host, port), "127.0.0.1", listen)
    print(f"listening on {listen}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
