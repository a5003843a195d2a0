"""The chaos run's publisher: ``python -m tests.chaos.publisher COUNT KEYS RATE HANG_AT OUTPUT``.

Publishes COUNT messages to ``chaos.events`` at about RATE per second, round-robin over
KEYS keys: message i has key ``k<i % KEYS>``, sequence number ``i // KEYS`` within its key
and the deterministic id ``<key>-<seq>``. Before message HANG_AT it publishes the one
message of ``chaos.hang`` (id ``hung-1``), whose handler never returns.

Each ``publish()`` runs on its own (autocommit). When one raises -- a killed session, the
server restarting -- the connection is dropped and the same message is published again
until it succeeds: if the failed attempt had committed after all (an ambiguous commit), the
retry finds its id and stores nothing. A message is written to OUTPUT (one line: id, topic,
key, seq, monotonic time, ``created``, attempts) only once ``publish()`` returned, so OUTPUT
lists exactly what the publisher saw committed.
"""

from __future__ import annotations

import os
import sys
import time


def main(count: int, keys: int, rate: float, hang_at: int, output: str) -> None:
    import django

    django.setup()
    from django.db import connection

    from django_sqlqueue import publish

    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    failures = 0

    def publish_until_committed(topic: str, payload: dict, key: str, message_id: str, seq: int) -> None:
        nonlocal failures
        attempts = 0
        while True:
            attempts += 1
            try:
                message = publish(topic, payload, key=key, id=message_id)
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect, publish the same id again
                failures += 1
                if failures <= 20 or failures % 100 == 0:
                    first_line = str(exc).splitlines()[0] if str(exc) else ""
                    print(f"publish {message_id} failed ({type(exc).__name__}: {first_line}); retrying", flush=True)
                connection.close()
                time.sleep(0.2)
                continue
            line = f"{message_id}\t{topic}\t{key}\t{seq}\t{time.monotonic():.6f}\t{int(message.created)}\t{attempts}\n"
            os.write(fd, line.encode())
            return

    start = time.monotonic()
    for i in range(count):
        if i == hang_at:
            publish_until_committed("chaos.hang", {"hang": True}, "hung", "hung-1", 0)
        key, seq = f"k{i % keys:03d}", i // keys
        publish_until_committed("chaos.events", {"key": key, "seq": seq}, key, f"{key}-{seq:05d}", seq)
        pause = start + (i + 1) / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    print(f"published {count} messages in {time.monotonic() - start:.1f}s, {failures} failed attempts", flush=True)


if __name__ == "__main__":
    count, keys, rate, hang_at, output = sys.argv[1:6]
    main(int(count), int(keys), float(rate), int(hang_at), output)
