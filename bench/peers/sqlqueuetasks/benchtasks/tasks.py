from benchlib.job import record as _record
from django_tasks import task


@task()
def record(job_id, phase, enq_ts):
    _record(job_id, phase, enq_ts)
