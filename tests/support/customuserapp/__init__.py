"""A test app with a custom user model whose primary key is a string (the username).

Installed only by ``tests/support/settings_custom_user.py`` (``AUTH_USER_MODEL`` cannot change
inside one test process): ``tests/console/test_custom_user.py`` runs
``tests/console/custom_user_scenario.py`` in a pytest subprocess with those settings, to
prove the console's audit log takes such a key as it is.
"""
