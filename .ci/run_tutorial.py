"""Follow docs/tutorial.md literally in an empty directory (called by .ci/tutorial).

Usage: python .ci/run_tutorial.py docs/tutorial.md PROJECT_DIR

Each ``<!-- tutorial: ACTION ... -->`` comment of the page says what to do, in order:

- ``file PATH`` / ``append PATH``: write / append the next fenced block to PATH;
- ``run``: run each line of the next fenced block with bash (set -e), in PROJECT_DIR;
- ``background NAME``: start the next fenced block in the background (log NAME.log);
  ``restart NAME``: SIGTERM it, wait, start it again; all are stopped at the end;
- ``wait COMMAND``: run COMMAND until it succeeds (60 s at most);
- ``skip ...``: the next fenced block is not run (the caller did its equivalent).

An action may end with ``[ENGINE]`` (``sqlite``, ``postgres`` or ``mysql``): it is done only
when the run is for that database (``TUTORIAL_ENGINE``, default ``sqlite``), otherwise its
block is skipped -- the page shows each database's variant of a step, and CI follows the
page once per database it runs.

Commands run with the caller's PATH (its virtualenv first). The tutorial's port 8000 is
replaced by a free one, so that the run does not collide with a server on this machine.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

MARKER = re.compile(r"<!-- tutorial: (\w+)\s*(.*?)\s*(?:\[(sqlite|postgres|mysql)\])?\s*-->")
ENGINES = ("sqlite", "postgres", "mysql")
FENCE = re.compile(r"^```[\w-]*\n(.*?)^```", re.S | re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    page, project = Path(sys.argv[1]).read_text(), Path(sys.argv[2])
    engine = os.environ.get("TUTORIAL_ENGINE", "sqlite")
    if engine not in ENGINES:
        raise SystemExit(f"tutorial: TUTORIAL_ENGINE must be one of {', '.join(ENGINES)}, not {engine!r}")
    project.mkdir(parents=True, exist_ok=True)
    port = str(free_port())

    def local(text: str) -> str:
        text = text.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        return re.sub(r"\bmanage\.py runserver\s*$", f"manage.py runserver 127.0.0.1:{port}", text, flags=re.M)

    background: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}

    def start(name: str, command: str) -> None:
        log = open(project / f"{name}.log", "ab")  # noqa: SIM115 - the child writes to it
        background[name] = (
            command,
            subprocess.Popen(
                ["bash", "-c", f"exec {command}"], cwd=project, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            ),
        )  # fmt: skip
        print(f"--- background {name}: {command}", flush=True)

    def stop(name: str) -> None:
        _command, proc = background.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait(10)
        print(f"--- stopped {name} (status {code})", flush=True)

    position, steps = 0, 0
    try:
        while (marker := MARKER.search(page, position)) is not None:
            action, argument, only = marker.group(1), marker.group(2), marker.group(3)
            position = marker.end()
            if only is not None and only != engine:
                # Another database's variant of this step: its block (if it has one) is not run.
                action = "skip" if action in {"file", "append", "run", "background", "skip"} else "ignore"
            else:
                steps += 1
            if action in {"file", "append", "run", "background", "skip"}:
                fence = FENCE.search(page, position)
                if fence is None:
                    raise SystemExit(f"tutorial: no code block after {marker.group(0)}")
                body, position = fence.group(1), fence.end()
            if action in {"file", "append"}:
                path = project / argument
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "a" if action == "append" else "w") as f:
                    f.write(("\n" if action == "append" else "") + body)
                print(f"--- {action} {argument}", flush=True)
            elif action == "run":
                print(f"--- run:\n{local(body)}", flush=True)
                subprocess.run(["bash", "-euxc", local(body)], cwd=project, check=True)
            elif action == "background":
                start(argument, local(body.strip()))
                time.sleep(1)
            elif action == "restart":
                command = background[argument][0]
                stop(argument)
                start(argument, command)
            elif action == "wait":
                command, deadline = local(argument), time.monotonic() + 60
                print(f"--- wait: {command}", flush=True)
                while subprocess.run(["bash", "-c", command], cwd=project, capture_output=True).returncode != 0:
                    if time.monotonic() > deadline:
                        for name in background:
                            print(f"--- {name}.log:\n{(project / f'{name}.log').read_text()[-3000:]}")
                        raise SystemExit(f"tutorial: timed out waiting for: {command}")
                    for name, (_, proc) in background.items():
                        if proc.poll() is not None:
                            print((project / f"{name}.log").read_text()[-3000:])
                            raise SystemExit(f"tutorial: background {name} exited ({proc.returncode})")
                    time.sleep(0.5)
            elif action not in {"skip", "ignore"}:
                raise SystemExit(f"tutorial: unknown action {action!r}")
    finally:
        for name in list(background):
            stop(name)
    print(f"tutorial OK on {engine}: {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
