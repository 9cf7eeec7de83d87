"""A TCP proxy between the pipeline and its database that the test drives: resets, stalls and kills at chosen commands.

The network faults a cleanup meets (a connection reset, a database that stops
answering, a server killed and restarted) are injected here, in user space, on
the wire: the proxy reads the MongoDB wire protocol (``OP_MSG``: a header, then
a command document whose first key names the command and its collection), so a
test can say *where* in the traffic a fault strikes:

- before a request reaches the server (the server never sees it),
- after the server answered, before the client hears the answer (the server
  applied it, the client cannot know: the hardest case),

and *what* strikes: every connection reset (RST), the traffic stalled (nothing
forwarded either way, for a time or until :meth:`FaultProxy.resume`), or any
callable (the test's own ``server.kill``).

    with FaultProxy(server.port) as proxy:
        proxy.on(Trigger("delete", "jobsBlue", nth=2, phase=REPLY), proxy.reset)
        client = MongoClient(f"mongodb://127.0.0.1:{proxy.port}/?retryWrites=false")

Threads and the standard library (plus ``bson`` to read a command); one proxy
per test, on a free port of 127.0.0.1, closed by the test that opened it.
Unlike ``benchmarks/proxy.py`` (a fixed delay for the benchmarks' round trips),
this one forwards at once until told otherwise.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import bson

REQUEST = "request"  # the command is held before the server sees it
REPLY = "reply"  # the server's answer is held before the client sees it
OP_MSG = 2013
_HEADER = struct.Struct("<iiii")  # messageLength, requestID, responseTo, opCode
_CHUNK = 1 << 16


@dataclass(frozen=True)
class Command:
    """A client's command as it crossed the proxy: its name and the collection (or value) it names."""

    name: str
    target: object
    request_id: int
    document: dict = field(default_factory=dict, compare=False, repr=False)  # the command itself, as sent


#: The driver's own conversation (handshake, monitoring, authentication, goodbye): never a trigger's "any command".
HOUSEKEEPING = frozenset(
    {"hello", "ismaster", "isMaster", "ping", "buildInfo", "buildinfo", "saslStart", "saslContinue", "endSessions"}
)


#: The commands that write.
WRITES = ("insert", "update", "delete", "findAndModify")


@dataclass
class Trigger:
    """Fires on the ``nth`` (1-based) command named ``command`` (several names: any of them; None: any but
    housekeeping) on ``collection`` (None: any) that ``where`` accepts (None: any), at ``phase``."""

    command: str | tuple[str, ...] | None = None
    collection: str | None = None
    nth: int = 1
    phase: str = REQUEST
    where: Callable[[dict], bool] | None = None  # given the command document (its body: no OP_MSG sequences)
    seen: int = 0  # matching requests so far
    request_id: int | None = None  # the nth one's, whose reply a REPLY trigger waits for
    fired_at: float | None = None  # time.time() when it fired
    done: threading.Event = field(default_factory=threading.Event)  # set once its action returned

    def matches(self, command: Command) -> bool:
        if self.command is None:
            named = command.name not in HOUSEKEEPING
        else:
            named = command.name in ((self.command,) if isinstance(self.command, str) else self.command)
        return (
            named
            and (self.collection is None or command.target == self.collection)
            and (self.where is None or self.where(command.document))
        )


Action = Callable[[], None]


@dataclass
class _Connection:
    client: socket.socket
    upstream: socket.socket
    pending: dict[int, Command] = field(default_factory=dict)  # request id -> command, awaiting its reply


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target_port``; faults on command or when the test says."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._connections: list[_Connection] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._rules: list[tuple[Trigger, Action]] = []
        self.commands: list[Command] = []  # every command seen, in order
        self.stalled_at: float | None = None  # time.time() when the last stall began
        self.resets = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what a test does -------------------------------------------------------------------------------

    def url(self, credentials: str = "", options: str = "retryWrites=false") -> str:
        """A URL through the proxy (``credentials`` as ``user:password``, already escaped)."""
        userinfo = f"{credentials}@" if credentials else ""
        return f"mongodb://{userinfo}127.0.0.1:{self.port}/?directConnection=true&{options}"

    def on(self, trigger: Trigger, action: Action) -> Trigger:
        """Run ``action`` when ``trigger`` fires (once), in the thread that forwards the traffic."""
        with self._lock:
            self._rules.append((trigger, action))
        return trigger

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def reset(self) -> None:
        """Every open connection reset (RST) at once: what a client sees when a network path or a server goes away."""
        with self._lock:
            connections, self._connections = self._connections, []
            self.resets += 1
        for connection in connections:
            _abort(connection.client)
            _abort(connection.upstream)

    def stall(self, seconds: float | None = None) -> None:
        """Nothing forwarded, either way, on any connection (new ones too); for ``seconds``, or until :meth:`resume`."""
        self.stalled_at = time.time()
        self._flowing.clear()
        if seconds is not None:
            timer = threading.Timer(seconds, self.resume)
            timer.daemon = True
            timer.start()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self.resume()
        try:
            self._listener.close()
        except OSError:
            pass
        self.reset()

    # --- the traffic --------------------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:  # the server is down: the client sees its connection closed
                _abort(client)
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(client, upstream)
            with self._lock:
                self._connections.append(connection)
            threading.Thread(target=self._pump, args=(connection, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(connection, False), daemon=True).start()

    def _pump(self, connection: _Connection, from_client: bool) -> None:
        source, sink = (
            (connection.client, connection.upstream) if from_client else (connection.upstream, connection.client)
        )
        buffer = b""
        while True:
            try:
                data = source.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            buffer += data
            while len(buffer) >= 4:
                length = int.from_bytes(buffer[:4], "little")
                if len(buffer) < length:
                    break
                message, buffer = buffer[:length], buffer[length:]
                if not self._forward(connection, message, sink, from_client):
                    return
        _abort(connection.client)
        _abort(connection.upstream)

    def _forward(self, connection: _Connection, message: bytes, sink: socket.socket, from_client: bool) -> bool:
        """Apply the rules to one message, then pass it on (unless a fault took it); False once the pipe is dead."""
        _, request_id, response_to, _ = _HEADER.unpack_from(message)
        if from_client:
            command = _command_of(message, request_id)
            if command is not None:
                with self._lock:
                    self.commands.append(command)
                connection.pending[request_id] = command
            self._fire(command, REQUEST)
        else:
            command = connection.pending.pop(response_to, None)
            self._fire(command, REPLY)
        self._flowing.wait()
        if connection not in self._connections:  # reset while the message was held: it is lost
            return False
        try:
            sink.sendall(message)
        except OSError:
            return False
        return True

    def _fire(self, command: Command | None, phase: str) -> None:
        """Count the command against every trigger (as a request); run the actions of those that fire now."""
        if command is None:
            return
        due = []
        with self._lock:
            for trigger, action in self._rules:
                if trigger.fired_at is not None or not trigger.matches(command):
                    continue
                if phase == REQUEST:
                    trigger.seen += 1
                    if trigger.seen == trigger.nth:
                        trigger.request_id = command.request_id
                if trigger.phase == phase and trigger.request_id == command.request_id:
                    trigger.fired_at = time.time()
                    due.append((trigger, action))
        for trigger, action in due:
            try:
                action()
            finally:
                trigger.done.set()


def _command_of(message: bytes, request_id: int) -> Command | None:
    """The command of an ``OP_MSG`` (its body section's first key and that key's value), else None.

    The command's document sequences (``documents`` of an insert, ``updates``, ``deletes``: pymongo sends a bulk
    write's statements as sequences beside the body) are joined to its document under their identifiers.
    """
    _, _, _, op_code = _HEADER.unpack_from(message)
    if op_code != OP_MSG or len(message) < 21 or message[20] != 0:  # flagBits, then a body section (kind 0)
        return None
    flags = int.from_bytes(message[16:20], "little")
    end = len(message) - (4 if flags & 1 else 0)  # checksumPresent: a CRC-32C closes the message
    size = int.from_bytes(message[21:25], "little")
    try:
        document = bson.decode(message[21 : 21 + size])
        offset = 21 + size
        while offset < end and message[offset] == 1:  # a document sequence: size, identifier, documents
            length = int.from_bytes(message[offset + 1 : offset + 5], "little")
            identifier_end = message.index(b"\0", offset + 5)
            identifier = message[offset + 5 : identifier_end].decode()
            document[identifier] = bson.decode_all(message[identifier_end + 1 : offset + 1 + length])
            offset += 1 + length
    except Exception:  # not ours to judge: forwarded as it is
        return None
    if not document:
        return None
    name, target = next(iter(document.items()))
    return Command(name, target if isinstance(target, str) else None, request_id, document)


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), not a polite FIN, so that the peer's next read fails at once.

    The socket is shut for reading first: a pump blocked in ``recv`` on it wakes (the kernel frees a socket, and
    sends the reset, only once no thread is in a call on it).
    """
    for step in (
        lambda: sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)),
        lambda: sock.shutdown(socket.SHUT_RD),
        sock.close,
    ):
        try:
            step()
        except OSError:
            pass
