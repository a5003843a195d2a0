"""Consumers for the console's process and browser tests (installed only in their runconsumer processes)."""
