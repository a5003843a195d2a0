"""Process settings with a slow renew interval (6 s), to show membership checks in between."""

from tests.support.process_settings import *  # noqa: F403
from tests.support.process_settings import SQLQUEUE as _BASE

SQLQUEUE = {**_BASE, "LEASE_DURATION": 20, "LEASE_RENEW_INTERVAL": 6}
