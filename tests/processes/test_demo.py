"""``manage.py demo --serve``: a styled console with a login, live workers, a clean Ctrl-C.

A real process on a free port, over HTTP (urllib, not Django's test client): the printed
credentials log in, the admin's CSS is served (``DEBUG=False`` otherwise serves none),
the console page renders; SIGINT stops the workers and the server cleanly.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from ..support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def wait_for(pattern: str, lines: list[str], proc: subprocess.Popen, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(lines):
            found = re.search(pattern, line)
            if found:
                return found
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not printed; output:\n{''.join(lines)}")


def test_demo_serve_shows_a_styled_console_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--orders", "8", "--serve", "--port", str(port), "--interval", "0.3"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        console = wait_for(r"console: (http://127\.0\.0\.1:\d+/\S+)", lines, proc, 120).group(1)
        user, password = wait_for(r"login:\s+(\S+) / (\S+)", lines, proc, 10).groups()
        base = f"http://127.0.0.1:{port}"
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        deadline = time.monotonic() + 30
        while True:  # the server may still be starting
            try:
                login_page = opener.open(f"{base}/admin/login/?next=/admin/", timeout=5).read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        css = re.search(r'href="(/static/admin/css/[^"]+\.css)"', login_page)
        assert css, login_page[:500]
        with opener.open(base + css.group(1), timeout=5) as response:
            assert response.status == 200 and b"{" in response.read()
        token = next(c.value for c in jar if c.name == "csrftoken")
        form = urllib.parse.urlencode(
            {"username": user, "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"}
        ).encode()
        request = urllib.request.Request(f"{base}/admin/login/?next=/admin/", data=form, headers={"Referer": base})
        with opener.open(request, timeout=10) as response:
            assert response.status == 200 and "/admin/login/" not in response.url, "login failed"
        with opener.open(console, timeout=20) as response:
            page = response.read().decode()
        assert response.status == 200
        assert "orders.created" in page and "billing" in page
        assert "/static/" in page  # styled: its stylesheets are linked, and served (above)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        reader.join(5)
    output = "".join(lines)
    assert code == 0, output[-3000:]
    assert len(re.findall(r"worker pid \d+ exited with status 0", output)) >= 4, output[-3000:]  # demo's and serve's
    assert re.search(r"runserver pid \d+ exited with status 0", output), output[-3000:]
