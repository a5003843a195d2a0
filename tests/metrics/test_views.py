"""metrics/views.py: who may read the gauges, and how other requests are answered (issue 28, F9).

Real database and the project's URLconf (testproject/urls.py mounts the view), with CSRF
checks on as in a browser or a scraper's request.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

from django_sqlqueue.metrics import views

from ..support.console_scene import SETTINGS, build

pytestmark = [pytest.mark.django_db]

TOKEN = "s3cret-token-for-the-scraper"
URL = "/sqlqueue/metrics"


@pytest.fixture(autouse=True)
def scene():
    views.clear_cache()
    with override_settings(SQLQUEUE={**SETTINGS, "METRICS_TOKEN": TOKEN}):
        build()
        yield
    views.clear_cache()


def staff(*codenames: str, superuser: bool = False) -> Client:
    user = User.objects.create_user(f"u{User.objects.count()}", is_staff=True, is_superuser=superuser)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_sqlqueue", codename__in=codenames)
    )
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def test_a_staff_user_needs_the_consoles_permission():
    """Before, any active staff user read every gauge while the console refused them."""
    refused = staff("pause_group").get(URL)
    assert refused.status_code == 403 and b"django_sqlqueue.view_queue" in refused.content
    assert staff("view_queue").get(URL).status_code == 200
    assert staff(superuser=True).get(URL).status_code == 200
    # The console agrees: the same user is refused there too.
    assert staff("pause_group").get("/admin/django_sqlqueue/queueconsole/").status_code == 403


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(scheme):
    """RFC 9110 11.1: the scheme is case-insensitive (``bearer <t>`` got 403 before)."""
    assert Client().get(URL, HTTP_AUTHORIZATION=f"{scheme} {TOKEN}").status_code == 200
    assert Client().get(URL, HTTP_AUTHORIZATION=f"{scheme}  {TOKEN} ").status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        "Bearer ",
        "Bearer",
        f"Basic {TOKEN}",
        f"Bearer{TOKEN}",
        TOKEN,
        f"Bearer {TOKEN[:-1]}é",  # a non-ASCII credential: no TypeError from compare_digest, a 403
    ],
)
def test_anything_but_the_token_is_refused(header):
    assert Client().get(URL, HTTP_AUTHORIZATION=header).status_code == 403


def test_a_wrong_bearer_token_does_not_fall_back_to_the_session():
    client = staff("view_queue")
    assert client.get(URL, HTTP_AUTHORIZATION="bearer wrong-token-wrong-token").status_code == 403
    assert client.get(URL).status_code == 200


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "head"])
def test_a_method_other_than_get_gets_405_as_the_docs_say(method):
    """Before, a POST got the CSRF middleware's 403 (docs/observability.md says 405)."""
    scraper = (Client(enforce_csrf_checks=True), {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"})
    for client, headers in [scraper, (staff("view_queue"), {})]:
        response = getattr(client, method)(URL, **headers)
        assert response.status_code == 405 and response["Allow"] == "GET"
        assert b"sqlqueue_" not in response.content


def test_the_403_is_plain_text():
    response = Client().get(URL)
    assert response.status_code == 403 and response["Content-Type"].startswith("text/plain")
