from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from examples.django_app.jobs import emitter
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
