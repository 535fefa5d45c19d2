"""A process on the ranks' machine that tries to keep a silent rank alive in the
eyes of another rank's watchdog (tests/test_watchdog.py).

    python tests/helpers/forger.py TARGET_PORT RANK

It listens on a UDP port of its own (the tap: a test has the rank send its
heartbeats there too, as someone who overhears them would) and prints
"tap PORT". Then, until its stdin closes, it sends to 127.0.0.1:TARGET_PORT
every FORGE_EVERY_S at the most, each time with a higher progress count, in
RANK's name:
- plain: a heartbeat in the form they had before they were signed;
- signed: one numbered, behind a signature that is not the rank's;
- altered: an overheard heartbeat with a higher progress count and number,
  under its own signature;
- replayed: an overheard heartbeat as it was, the overheard ones in turn.
At the end it prints how many datagrams of each kind it sent, and how many it
overheard, as one JSON line.
"""
import json
import os
import select
import socket
import sys

FORGE_EVERY_S = 0.05
SIGNATURE_BYTES = 32  # HMAC-SHA-256's


def heartbeat(rank, progress):
    return {"rank": rank, "phase": "training step", "where": f"epoch 1, step {progress}", "slow": False,
            "entered": progress, "progress": progress}


def forgeries(rank, progress, overheard):
    """(kind, datagram) of one round."""
    plain = heartbeat(rank, progress)
    yield "plain", json.dumps(plain).encode()
    yield "signed", os.urandom(SIGNATURE_BYTES) + json.dumps(dict(plain, seq=10**9 + progress)).encode()
    if overheard:
        datagram = overheard[progress % len(overheard)]
        signature, message = datagram[:SIGNATURE_BYTES], json.loads(datagram[SIGNATURE_BYTES:])
        message.update(progress=message["progress"] + progress, seq=message["seq"] + progress)
        yield "altered", signature + json.dumps(message).encode()
        yield "replayed", datagram


def main(target_port, rank):
    tap = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tap.bind(("127.0.0.1", 0))
    print(f"tap {tap.getsockname()[1]}", flush=True)
    overheard = []
    sent = {"plain": 0, "signed": 0, "altered": 0, "replayed": 0}
    progress = 0
    while True:
        ready = select.select([sys.stdin, tap], [], [], FORGE_EVERY_S)[0]
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            break
        if tap in ready:
            overheard.append(tap.recv(4096))
        progress += 1
        for kind, datagram in forgeries(rank, progress, overheard):
            tap.sendto(datagram, ("127.0.0.1", target_port))
            sent[kind] += 1
    print(json.dumps(dict(sent, overheard=len(overheard))), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
