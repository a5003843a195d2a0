"""A pipeline on a Spark standalone cluster: a master and two workers started from
pyspark's own distribution as local processes, the backfill submitted to it by
``manage.py queue_pipeline --master spark://...`` in a separate process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from django_sqlqueue.models import Message

from ..support.ports import free_port
from .conftest import ROOT, spark_environment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"process exited with {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"nothing listens on port {port} after {timeout}s")


@pytest.fixture
def cluster(tmp_path):
    import pyspark

    spark_environment()
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent), "SPARK_LOCAL_IP": "127.0.0.1"}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        out = open(logs / f"{name}.log", "w")  # noqa: SIM115 - open while the process runs
        proc = subprocess.Popen([spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    master = start(
        "master",
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--webui-port",
        str(free_port()),
    )
    workdirs = []
    try:
        _wait_port(port, master)
        for i in range(2):
            workdir = tmp_path / f"worker{i}"
            workdirs.append(workdir)
            start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(workdir),
                "--webui-port",
                str(free_port()),
                "--host",
                "127.0.0.1",
                url,
            )
        # Wait until both workers registered with the master.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = (logs / "master.log").read_text()
            if text.count("Registering worker") >= 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the workers did not register:\n" + (logs / "master.log").read_text()[-3000:])
        yield url, workdirs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_backfill_runs_on_a_standalone_cluster(spark, cluster, tmp_path):
    if connection.vendor != "mysql":
        pytest.skip("the submitted process is pointed at the test database by a mysql:// DATABASE_URL")
    url, workdirs = cluster
    source = str(tmp_path / "rows.parquet")
    rows = [(f"r{i}", f"k{i % 17}", i) for i in range(2000)]
    spark.createDataFrame(rows, "id string, key string, n long").repartition(4).write.parquet(source)

    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings",
        "DATABASE_URL": f"mysql://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    cmd = [
        sys.executable,
        "manage.py",
        "queue_pipeline",
        "backfill",
        source,
        "--topic",
        "clustered",
        "--id-column",
        "id",
        "--key-column",
        "key",
        "--master",
        url,
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.executor.cores=1",
        "--conf",
        f"spark.executorEnv.PYTHONPATH={ROOT}",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        "spark.ui.enabled=false",
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "2000 source row(s), 2000 new message(s)" in done.stdout

    assert Message.objects.filter(topic="clustered").count() == 2000
    assert Message.objects.get(topic="clustered", id="r42").payload == {"n": 42}
    # Both workers ran an executor of the application (its work directory holds its logs).
    for workdir in workdirs:
        apps = [p for p in workdir.iterdir() if p.name.startswith("app-")] if workdir.exists() else []
        assert apps, f"no executor ran on {workdir}"
