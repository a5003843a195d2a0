"""The exactly-once run's app (tests/chaos/exactly_once.py): its topics and groups, Django-free."""

#: The topic every group consumes.
EVENTS = "eo.events"
#: Each group's ``atomic=`` (the same handler, the same faults): ``plain`` is the control
#: group, at-least-once, whose duplicates show that the faults do hit handlers.
MODES: dict[str, bool | str] = {"per": True, "batch": "batch", "plain": False}
GROUPS = tuple(MODES)
#: The follow-up topic of each group, consumed by nobody (garbage collection keeps a topic
#: nobody consumes whole, so every follow-up is there to count at the end).
FOLLOWUPS = {group: f"eo.followups.{group}" for group in GROUPS}
