"""Peer adapter: django-sqlqueue's django.tasks backend (SQLQueueBackend), for the shared peer harness.

Same API as the djangotasks peer: ``record.enqueue(job_id, phase, enq_ts)`` with the
django-tasks backport on Django 5.2. Enqueue = one publish() into the ``tasks.default``
topic (autocommit); workers = W x ``manage.py runconsumer --group tasks`` (one handler at a
time per process, as the other peers' W=2 processes). Each task writes its result row, as
django-tasks-db does: since issue 17 once (SUCCESSFUL) for a task shorter than
``MARK_RUNNING_AFTER``, RUNNING first for a longer one. Run with bench/tasks_peer.sh.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "sqlqueuetasks"
LABEL = "django-sqlqueue tasks backend"
DB = os.environ.get("BENCH_SQLQUEUETASKS_DB", "bench_sqlqueuetasks")  # a private one: bench_<tag>
PACKAGES = ["Django", "django-tasks", "mysqlclient"]

_task = None
_enqueued = 0


def setup_schema():
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=HERE, check=True)


def init_client():
    global _task
    sys.path.insert(0, HERE)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    import django

    django.setup()
    from benchtasks.tasks import record

    _task = record


def config():
    from django.conf import settings

    src = settings.SQLQUEUE_SRC
    rev = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    return {
        "django_sqlqueue_git_rev": rev.strip(),
        "TASKS": settings.TASKS,
        "SQLQUEUE": settings.SQLQUEUE,
        "CONN_MAX_AGE": settings.DATABASES["default"]["CONN_MAX_AGE"],
        "worker_command": "manage.py runconsumer --group tasks --no-schedules --name bench-wI -v 0 (x W)",
    }


def enqueue(job_id, phase, enq_ts):
    global _enqueued
    _task.enqueue(job_id, phase, enq_ts)
    _enqueued += 1


def worker_commands(workers, poll):
    env = dict(os.environ, BENCH_POLL=str(poll))
    return [
        {
            "argv": [
                sys.executable,
                "manage.py",
                "runconsumer",
                "--group",
                "tasks",
                "--no-schedules",
                "--name",
                f"bench-w{i}",
                "-v",
                "0",
            ],
            "cwd": HERE,
            "env": env,
        }
        for i in range(workers)
    ]


def queue_state():
    from django.db import connection

    from django_sqlqueue.models import Message
    from django_sqlqueue.task_models import TaskResultRecord

    connection.close_if_unusable_or_obsolete()
    succeeded = TaskResultRecord.objects.filter(status="SUCCESSFUL").count()
    failed = TaskResultRecord.objects.filter(status="FAILED").count()
    failed += Message.objects.filter(topic="tasks.default_dlq").count()
    return {
        # Enqueued by this process (the harness enqueues in-process) minus finished tasks.
        "pending": _enqueued - succeeded - TaskResultRecord.objects.filter(status="FAILED").count(),
        "failed": failed,
        "succeeded": succeeded,
    }
