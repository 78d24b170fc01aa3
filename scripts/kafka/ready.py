#!/usr/bin/env python3
"""Whether a Kafka broker on HOST:PORT answers a metadata request.

Exit 0 when the broker answers a Metadata request (v4, all topics) and lists
at least one broker, 1 otherwise. A broker whose socket is open may still be
starting (its KRaft controller not yet elected, itself not yet registered);
a metadata answer naming a broker is what a client needs to begin.

    ready.py HOST PORT [TIMEOUT_SECONDS]
"""
import socket
import struct
import sys


def metadata_brokers(host: str, port: int, timeout: float) -> int:
    client = b"reconciler-ready"
    # Request header v1: api_key 3 (Metadata), version 4, correlation id,
    # client id; body: topics = null (all), allow_auto_topic_creation = false.
    body = struct.pack(">hhih", 3, 4, 7, len(client)) + client + struct.pack(">ib", -1, 0)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", recv_exact(s, 4))[0]
        resp = recv_exact(s, size)
    correlation, _throttle, brokers = struct.unpack(">iii", resp[:12])
    if correlation != 7:
        raise ValueError(f"correlation id {correlation}, expected 7")
    return brokers


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return buf


def main() -> int:
    host, port = sys.argv[1], int(sys.argv[2])
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    try:
        return 0 if metadata_brokers(host, port, timeout) > 0 else 1
    except (OSError, ValueError, struct.error) as e:
        print(f"{host}:{port}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
