"""Process settings for the outage tests: a "still unreachable" line every second."""

from tests.support.process_settings import *  # noqa: F403
from tests.support.process_settings import SQLQUEUE as _BASE

SQLQUEUE = {**_BASE, "OUTAGE_REPORT_INTERVAL": 1}
