from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

try:
    from django.tasks import default_task_backend  # Django 6
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2, with the django-tasks backport
    from django_tasks import default_task_backend
    from django_tasks.exceptions import TaskResultDoesNotExist

from examples.django_app.jobs import emitter
from examples.django_app.models import Order
from examples.django_app.settings import EXPRESS
from examples.django_app.tasks import send_receipt
from hermes.core import Message


@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    try:
        data = json.loads(request.body)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not data.get("email") or not data.get("name"):
        return JsonResponse({"error": "send a JSON object with email and name"}, status=400)
    message = Message("send-welcome", {"email": data["email"], "name": data["name"]})
    # Emit once the transaction commits (at once outside one): a worker must
    # never get a job about a row that was rolled back, or not yet committed.
    transaction.on_commit(lambda: emitter().emit(message))
    return JsonResponse({"queued": message.id}, status=202)


@require_POST
def order(request: HttpRequest) -> JsonResponse:
    """Write the order and enqueue its receipt in one transaction: no order, no receipt.

    ``"express": true`` sends the receipt at a higher priority; ``"send_after_s": N``
    not before N seconds from now.
    """
    data = _order_data(request)
    if data is None:
        return JsonResponse({"error": "send a JSON object with email and order"}, status=400)
    receipt = send_receipt.using(priority=EXPRESS if data.get("express") else 0)
    if isinstance(data.get("send_after_s"), int | float):
        receipt = receipt.using(run_after=timezone.now() + timedelta(seconds=data["send_after_s"]))
    try:
        with transaction.atomic():
            # Sent when the transaction commits (enqueue_on_commit), never if it rolls
            # back: enqueued before the row is written, it still waits for the commit.
            result = receipt.enqueue(data["order"])
            Order.objects.create(number=data["order"], email=data["email"])
    except IntegrityError:
        return JsonResponse({"error": f"order {data['order']} exists"}, status=409)
    return JsonResponse({"task": result.id}, status=202)


def _order_data(request: HttpRequest) -> dict[str, Any] | None:
    try:
        data = json.loads(request.body)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("email") and isinstance(data.get("order"), int):
        return data
    return None


@require_GET
def receipt(request: HttpRequest, task_id: str) -> JsonResponse:
    """What the task's job record says: its status and, once it succeeded, what it returned."""
    try:
        result = default_task_backend.get_result(task_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"error": f"no task {task_id}"}, status=404)
    body: dict[str, object] = {"status": str(result.status)}
    if result.started_at is not None:
        body["started_at"] = result.started_at.isoformat()
    if result.is_finished and not result.errors:
        body["return_value"] = result.return_value
    if result.errors:
        body["errors"] = [
            {"exception": error.exception_class_path, "traceback": error.traceback}
            for error in result.errors
        ]
    return JsonResponse(body)


async def order_async(request: HttpRequest) -> JsonResponse:
    """The same from an async view: neither the ORM nor aenqueue() blocks the event loop."""
    data = _order_data(request)
    if data is None:
        return JsonResponse({"error": "send a JSON object with email and order"}, status=400)
    await Order.objects.acreate(number=data["order"], email=data["email"])
    result = await send_receipt.aenqueue(data["order"])
    return JsonResponse({"task": result.id}, status=202)
