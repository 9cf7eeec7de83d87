"""A TCP proxy that adds a fixed delay to every client -> server chunk: an injected round-trip time.

The benchmark measures both regimes a cleanup meets: a database on the same
host (round trips of a few tens of microseconds) and one across the network
(a millisecond and more). This kernel has no ``netem``, so the network is
simulated here, in user space: each chunk the client sends is held for
``delay`` seconds, then forwarded; replies go back at once. A command and its
reply thus cost ``delay`` more, which is what a round trip costs; the order of
the bytes on each connection is kept.

Standard library only, threads (``time.sleep`` wakes within tens of
microseconds, ``asyncio``'s timers in whole milliseconds). Run as a separate
process, so that its work never competes with the measured client for the
GIL:

    python benchmarks/proxy.py --target 127.0.0.1:27017 --delay-ms 1
    # prints "listening 127.0.0.1:PORT", then forwards until SIGTERM

The benchmark starts it on a free port and stops it by its PID
(``benchmarks.servers.delay_proxy``).
"""

from __future__ import annotations

import argparse
import collections
import signal
import socket
import sys
import threading
import time

CHUNK = 1 << 16


def _nodelay(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Delayed:
    """Chunks with the time each may leave; one reader thread puts, one sender thread takes, in order."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._ready = threading.Condition()

    def put(self, due: float, data: bytes | None) -> None:
        with self._ready:
            self._items.append((due, data))
            self._ready.notify()

    def take(self) -> tuple[float, bytes | None]:
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._items.popleft()


class DelayProxy:
    """Listen on ``host:port`` (0: a free port); forward each connection to ``target``, delaying what the client sends."""

    def __init__(self, target: tuple[str, int], delay_seconds: float, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self.delay = max(0.0, delay_seconds)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(128)
        self.address = self.listener.getsockname()
        self.connections = 0

    def serve_forever(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # the listener was closed: stop
                return
            self.connections += 1
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        for sock in (client, upstream):
            _nodelay(sock)
        queue = _Delayed()
        threading.Thread(target=self._read_client, args=(client, queue), daemon=True).start()
        threading.Thread(target=self._send_upstream, args=(queue, upstream, client), daemon=True).start()
        self._pipe_back(upstream, client)

    def _read_client(self, client: socket.socket, queue: _Delayed) -> None:
        """Stamp each chunk with the time it may leave (the delay counts from its arrival)."""
        while True:
            try:
                data = client.recv(CHUNK)
            except OSError:
                data = b""
            queue.put(time.monotonic() + self.delay, data or None)
            if not data:
                return

    @staticmethod
    def _send_upstream(queue: _Delayed, upstream: socket.socket, client: socket.socket) -> None:
        while True:
            due, data = queue.take()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                upstream.sendall(data)
            except OSError:
                break
        _close(upstream, client)

    @staticmethod
    def _pipe_back(upstream: socket.socket, client: socket.socket) -> None:
        while True:
            try:
                data = upstream.recv(CHUNK)
                if not data:
                    break
                client.sendall(data)
            except OSError:
                break
        _close(upstream, client)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of the server")
    parser.add_argument("--delay-ms", type=float, required=True, help="added to every client -> server chunk")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    proxy = DelayProxy((host, int(port)), args.delay_ms / 1000, args.host, args.port)

    def stop(*_: object) -> None:
        proxy.close()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"listening {proxy.address[0]}:{proxy.address[1]}", flush=True)
    proxy.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
