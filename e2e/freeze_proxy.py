#!/usr/bin/env python3
"""A proxy that stalls connections: on SIGUSR1 every connection open at that moment
stops moving bytes (both ways) but stays open, as a watch through a hung load balancer
does; connections made afterwards pass. SIGUSR2 lets the stalled ones go again.

    e2e/freeze_proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT
        [--tls CERT KEY --upstream-ca CA [--only TEXT]...]

Plain, it moves TCP bytes and cannot tell one request from another. With --tls it ends
the client's TLS (HTTP/1.1, served with CERT and KEY), opens its own to the target
(verified with CA) and reads each request's first line; --only TEXT then freezes only
the connections whose latest request is a watch (`watch=true`) whose path contains
TEXT (one of them, when given again): one kind's watch stalls while every other
request of the same client goes on.
"""
import argparse
import asyncio
import re
import signal
import ssl

REQUEST_LINE = re.compile(rb"^(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (\S+) HTTP/1\.[01]\r\n")


class Conn:
    def __init__(self):
        self.gate = asyncio.Event()  # set while the connection may move bytes
        self.gate.set()
        self.path = b""  # the latest request's path (TLS mode only)


conns = {}
next_id = 0
only = []  # the texts of --only (empty: every connection stalls)


async def pump(reader, writer, conn, requests):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if requests:
                m = REQUEST_LINE.match(data)
                if m:
                    conn.path = m.group(1)
            await conn.gate.wait()
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def handle(client_r, client_w, host, port, upstream_tls):
    global next_id
    next_id += 1
    cid = next_id
    conn = Conn()
    conns[cid] = conn
    try:
        server_r, server_w = await asyncio.open_connection(
            host, port, ssl=upstream_tls, server_hostname=host if upstream_tls else None
        )
    except (OSError, ssl.SSLError) as e:
        print(f"connection {cid}: cannot reach {host}:{port}: {e}", flush=True)
        client_w.close()
        conns.pop(cid, None)
        return
    reading = upstream_tls is not None
    await asyncio.gather(pump(client_r, server_w, conn, reading), pump(server_r, client_w, conn, False))
    conns.pop(cid, None)


def stalls(conn):
    if not only:
        return True
    watch = b"watch=true" in conn.path or b"watch=1" in conn.path
    return watch and any(text in conn.path for text in only)


def freeze():
    frozen = [c for c in conns.values() if stalls(c)]
    for c in frozen:
        c.gate.clear()
    paths = ", ".join(sorted(c.path.decode(errors="replace").split("?")[0] for c in frozen if c.path))
    print(f"froze {len(frozen)} connection(s) of {len(conns)}" + (f": {paths}" if paths else ""), flush=True)


def thaw():
    for c in conns.values():
        c.gate.set()
    print("thawed", flush=True)


async def main():
    global only
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("listen", type=int)
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--upstream-ca")
    ap.add_argument("--only", action="append", default=[])
    args = ap.parse_args()
    if args.only and args.tls is None:
        ap.error("--only reads requests: it needs --tls")
    if (args.tls is None) != (args.upstream_ca is None):
        ap.error("--tls and --upstream-ca go together")
    only = [text.encode() for text in args.only]
    serve_tls = upstream_tls = None
    if args.tls:
        serve_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serve_tls.load_cert_chain(*args.tls)
        serve_tls.set_alpn_protocols(["http/1.1"])
        upstream_tls = ssl.create_default_context(cafile=args.upstream_ca)
        upstream_tls.set_alpn_protocols(["http/1.1"])
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, freeze)
    loop.add_signal_handler(signal.SIGUSR2, thaw)
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, args.host, args.port, upstream_tls), "127.0.0.1", args.listen, ssl=serve_tls
    )
    print(f"listening on {args.listen}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
