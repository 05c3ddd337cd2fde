"""A network partition between one worker and NATS: a TCP relay the worker connects through.

`cut()` makes it a black hole, as a partitioned network is: the worker's connection stays open
but nothing crosses it either way, and a new connection gets in and hears nothing either (no
reset, no refusal the client could take as news). `heal()` resets the connections that were cut,
as TCP eventually does after a long partition, and relays again; the worker reconnects as it
would after any outage. Threads, so a synchronous chaos test can drive it while the stack runs.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable


class Partition:
    def __init__(self, upstream: Callable[[], str]) -> None:
        self.upstream = upstream  # the NATS URL: known only once the stack has started its server
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"nats://127.0.0.1:{self._listener.getsockname()[1]}"
        self.cut_at: float | None = None  # wall time of the last cut, while cut
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=f"partition {self.url}").start()

    def cut(self) -> float:
        """From now on nothing crosses; the wall time it was cut."""
        with self._lock:
            self.cut_at = time.time()
            return self.cut_at

    def heal(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
            self.cut_at = None
        for pair in pairs:
            _close(*pair)

    def close(self) -> None:
        self._listener.close()
        self.heal()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            host, port = self.upstream().removeprefix("nats://").rsplit(":", 1)
            try:
                server = socket.create_connection((host, int(port)), timeout=5)
                server.settimeout(None)
            except OSError:  # NATS itself is down (restarted): the client tries again
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.cut_at is None:
                    dst.sendall(data)
                # cut: read and dropped, so the sender's writes never block and never fail
        except OSError:
            pass
        finally:
            _close(src, dst)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
