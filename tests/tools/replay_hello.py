#!/usr/bin/env python3
"""Replays a captured hello to the syncer (docs/security.md, "Tests").

    replay_hello.py SYNCER_ADDR -- UNIT_COMMAND...

A tap listens on 127.0.0.1 and forwards one connection to SYNCER_ADDR, recording every byte
the unit sends. UNIT_COMMAND is run with `--set syncer.address=<the tap>` added: an honest unit
(with the run's secret) whose bytes are captured. Then the captured bytes are played verbatim
on a new connection to the syncer, after reading its (new) challenge.

The link's handshake (include/ddiloco/link_auth.hpp) answers with a verdict: status u8 (0
admitted, 1 refused, 2 not authenticated). Exit status 0 when the syncer answered the replay
"not authenticated" (or closed without admitting it), 1 when it admitted it or judged its hello
(a replay the syncer believed), 2 when nothing was captured.
"""
import socket
import subprocess
import sys
import threading

from tap import pump


def main():
    sep = sys.argv.index("--")
    host, port = sys.argv[1].rsplit(":", 1)
    target = (host, int(port))
    command = sys.argv[sep + 1:]
    tap = socket.socket()
    tap.bind(("127.0.0.1", 0))
    tap.listen(1)
    tap.settimeout(60)
    unit = subprocess.Popen(command + ["--set", f"syncer.address=127.0.0.1:{tap.getsockname()[1]}"])
    captured = []
    try:
        conn, _ = tap.accept()
        upstream = socket.create_connection(target, timeout=10)
        up = threading.Thread(target=pump, args=(conn, upstream, captured, 1 << 20))
        down = threading.Thread(target=pump, args=(upstream, conn, None))
        up.start(); down.start()
        unit.wait(timeout=120)
        up.join(10); down.join(10)
    finally:
        if unit.poll() is None:
            unit.kill()
            unit.wait()
        tap.close()
    # Only the first connection's bytes: the unit's answer to the syncer's first challenge.
    recorded = b"".join(captured)
    print(f"captured {len(recorded)} bytes of an honest unit's handshake (unit exited {unit.returncode})")
    if not recorded:
        return 2
    s = socket.create_connection(target, timeout=10)
    challenge = s.recv(41)
    print(f"new challenge: {len(challenge)} bytes")
    s.sendall(recorded)
    s.settimeout(10)
    try:
        status = s.recv(1)
    except OSError as e:
        status = b""
        print(f"reading the verdict: {e}")
    s.close()
    if status == b"\x02" or status == b"":
        print("replay refused: " + ("not authenticated" if status else "closed without a verdict"))
        return 0
    print(f"REPLAY BELIEVED: verdict status {status[0]}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
