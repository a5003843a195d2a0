"""Example views: an order and its ``orders.created`` event commit together or not at all."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.http import HttpRequest, HttpResponseBadRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_sqlqueue import publish

from .models import Order

TOPIC = "orders.created"


class PaymentDeclined(Exception):
    pass


def _read(request: HttpRequest) -> tuple[str, Decimal]:
    customer = request.POST.get("customer", "").strip()
    if not customer:
        raise ValueError("customer is required")
    try:
        total = Decimal(request.POST.get("total", "0"))
    except InvalidOperation as exc:
        raise ValueError("total must be a decimal number") from exc
    return customer, total


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    """Create an order and publish its event in one transaction (the outbox pattern)."""
    try:
        customer, total = _read(request)
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc))
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=total)
        message = publish(
            TOPIC,
            {"order_id": order.pk, "customer": customer, "total": total},
            key=customer,  # one customer's events stay in order
            id=f"order-{order.pk}",
        )
    return JsonResponse({"order_id": order.pk, "partition": message.partition, "message_id": message.id}, status=201)


@csrf_exempt
@require_POST
def create_order_then_fail(request: HttpRequest) -> JsonResponse:
    """Publish, then fail before commit: neither the order nor the event survives."""
    try:
        customer, total = _read(request)
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc))
    try:
        with transaction.atomic():
            order = Order.objects.create(customer=customer, total=total)
            publish(TOPIC, {"order_id": order.pk, "customer": customer, "total": total}, key=customer)
            raise PaymentDeclined(f"card of {customer} declined")
    except PaymentDeclined as exc:
        return JsonResponse({"error": str(exc), "rolled_back": True}, status=402)
