"""The commands: each parses its arguments and calls the engine (``worker``) or the operator
services (``ops``); ``_console.py`` holds the parsing the ``queue_*`` commands share."""
