"""A TCP connection from every worker to the head: who is alive, and the rendezvous.

MPI itself does not tell a process that a connected peer died (measured with the MPICH 5
wheel: a receive from a SIGKILLed worker simply never completes), so liveness travels on a
plain socket per worker. When a process dies, its kernel closes its sockets: the head sees
end-of-file on the dead worker's socket (and names it), and a worker sees end-of-file on its
socket when the head is gone, then exits. Nothing is sent on these sockets after the hello,
so they cost nothing while the job runs; ``select`` with a zero timeout checks them.

Hello (once, one JSON line each way): the worker sends its world rank, host and pid; the head
answers with the MPI port name to connect to (empty where the communicator already exists).

Doorbell (``wait="socket"``, the default): after each MPI command the head writes one byte to the
worker's socket, and the worker writes one before sending its result; each side sleeps in
``select`` until its byte comes, so a waiting process wakes as soon as the kernel delivers it
instead of polling MPI with sleeps (on an oversubscribed node a sleeping poller wakes late).
"""
from __future__ import annotations

import json
import select
import socket
import time


def _readline(sock: socket.socket, deadline: float) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no hello line in time")
        sock.settimeout(left)
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed during hello")
        data += chunk
    return data


def _keepalive(sock: socket.socket) -> None:
    """Notice a vanished peer host (no FIN) within about a minute, not hours."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 20), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class HeadLifeline:
    """The head's listening socket and one accepted socket per worker (keyed by worker index)."""

    def __init__(self, host: str | None = None):
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("0.0.0.0", 0))
        self._server.listen(128)
        self.address = f"{host or socket.gethostname()}:{self._server.getsockname()[1]}"
        """host:port the workers connect to."""
        self.peers: dict[int, socket.socket] = {}
        self.hello: dict[int, dict] = {}

    def accept(self, count: int, port_name: str, timeout: float, check=None) -> None:
        """Take ``count`` workers' hellos, answer each with ``port_name``; ``check()`` runs while waiting
        (it raises to give up early, e.g. when the worker launcher exited). TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while len(self.peers) < count:
            if check is not None:
                check()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(self.peers)} of {count} workers connected")
            ready, _, _ = select.select([self._server], [], [], min(left, 0.2))
            if not ready:
                continue
            sock, _ = self._server.accept()
            try:
                hello = json.loads(_readline(sock, time.monotonic() + 10))
                sock.sendall((json.dumps({"port": port_name}) + "\n").encode())
            except (OSError, ValueError, TimeoutError):
                sock.close()
                continue
            _keepalive(sock)
            sock.settimeout(None)
            self.peers[int(hello["worker"])] = sock
            self.hello[int(hello["worker"])] = hello

    def dead(self) -> list[int]:
        """Workers whose socket reached end-of-file (their process is gone), in index order."""
        socks = list(self.peers.values())
        if not socks:
            return []
        readable, _, _ = select.select(socks, [], [], 0)
        gone = []
        for index, sock in self.peers.items():
            if sock in readable:
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        gone.append(index)
                except OSError:
                    gone.append(index)
        return sorted(gone)

    def ring(self, index: int) -> None:
        """Wake worker ``index`` (one byte); a closed socket is found by :meth:`wait_rings`."""
        try:
            self.peers[index].send(b"\x01")
        except OSError:
            pass

    def wait_rings(self, pending: set, timeout: float) -> tuple[set, list[int]]:
        """Workers in ``pending`` that rang within ``timeout`` s, and those whose socket closed."""
        socks = {self.peers[i]: i for i in pending}
        readable, _, _ = select.select(list(socks), [], [], timeout)
        rung, gone = set(), []
        for sock in readable:
            try:
                data = sock.recv(64)
            except OSError:
                data = b""
            (rung.add if data else gone.append)(socks[sock])
        return rung, sorted(gone)

    def close(self) -> None:
        """Close every socket: workers that are still alive see end-of-file and exit."""
        for sock in self.peers.values():
            try:
                sock.close()
            except OSError:
                pass
        self.peers = {}
        self._server.close()


class WorkerLifeline:
    """A worker's socket to the head: ``connect`` sends the hello and returns the MPI port name."""

    def __init__(self, address: str, hello: dict, timeout: float = 60.0):
        host, _, port = address.rpartition(":")
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((host, int(port)), timeout=10)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.sock.sendall((json.dumps(hello) + "\n").encode())
        self.port_name = json.loads(_readline(self.sock, deadline + 10))["port"]
        _keepalive(self.sock)
        self.sock.settimeout(None)

    def head_gone(self) -> bool:
        """True once the head's end of the socket is closed (the head exited or died)."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def ring(self) -> None:
        self.sock.send(b"\x01")

    def wait_ring(self, timeout: float) -> bool | None:
        """True when the head rang within ``timeout`` s, False if not, None when the head is gone."""
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if not readable:
            return False
        try:
            return True if self.sock.recv(1) else None
        except OSError:
            return None

    def close(self) -> None:
        self.sock.close()
