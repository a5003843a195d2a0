"""The operator console in the Django admin: views hung off ``QueueConsoleAdmin.get_urls()``.

Every view runs inside ``admin_site.admin_view()`` (staff only, CSRF, never cached),
checks the console's own permissions (``django_sqlqueue.view_queue`` to look, one
permission per action, re-checked on every POST), renders templates that extend
``admin/base_site.html`` with ``admin_site.each_context(request)``, and calls the
services of :mod:`django_sqlqueue.ops` -- the same ones as the ``queue_*`` commands.
"""
