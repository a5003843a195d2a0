"""The TASKS setting of the task tests (in-process tests apply it with override_settings)."""

TASKS = {
    "default": {
        "BACKEND": "django_sqlqueue.tasks.SQLQueueBackend",
        "QUEUES": ["default", "other"],
        "OPTIONS": {"MAX_ATTEMPTS": 3},
    }
}
