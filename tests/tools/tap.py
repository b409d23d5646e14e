#!/usr/bin/env python3
"""A socket-level tap between units and the syncer (docs/security.md, "Tests").

    tap.py TARGET PORT_FILE OUT_DIR [--cap-mib 16]

Listens on 127.0.0.1 (any free port, written to PORT_FILE), forwards every connection to
TARGET ("ip:port") and records what crosses it, each direction of each connection in its own
file of OUT_DIR (conn<N>.up: unit → syncer, conn<N>.down), the first --cap-mib MiB of each.
Runs until killed (SIGTERM). Also a library: pump() forwards one direction.
"""
import os
import signal
import socket
import sys
import threading


def pump(src, dst, record=None, cap=0):
    """Forwards src → dst until either ends; appends up to `cap` bytes to the list `record`."""
    kept = 0
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if record is not None and kept < cap:
                record.append(data[:cap - kept])
                kept += len(record[-1])
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    port_file, out = sys.argv[2], sys.argv[3]
    cap = int(sys.argv[5]) << 20 if len(sys.argv) > 5 and sys.argv[4] == "--cap-mib" else 16 << 20
    os.makedirs(out, exist_ok=True)
    tap = socket.socket()
    tap.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tap.bind(("127.0.0.1", 0))
    tap.listen(16)
    with open(port_file + ".tmp", "w") as f:
        f.write(f"127.0.0.1:{tap.getsockname()[1]}\n")
    os.rename(port_file + ".tmp", port_file)
    records = []

    def flush(*_):
        for n, (up, down) in enumerate(records):
            for name, rec in (("up", up), ("down", down)):
                with open(os.path.join(out, f"conn{n}.{name}"), "wb") as f:
                    f.write(b"".join(rec))
        os._exit(0)

    signal.signal(signal.SIGTERM, flush)
    while True:
        conn, _ = tap.accept()
        try:
            upstream = socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            conn.close()
            continue
        upstream.settimeout(None)
        up, down = [], []
        records.append((up, down))
        threading.Thread(target=pump, args=(conn, upstream, up, cap), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, conn, down, cap), daemon=True).start()


if __name__ == "__main__":
    main()
