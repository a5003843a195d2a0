"""Django's management commands: ``runconsumer`` and the operators' ``queue_*`` commands."""
