"""A Flask app whose view emits a job and answers at once.

HERMES_URL=redis://localhost:6379/0 flask --app examples.flask_app.app run
hermes worker --url redis://localhost:6379/0 --handlers examples.flask_app.worker:handlers
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, current_app, request

from hermes.core import Emitter, Message, connect


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config["HERMES_URL"] = os.environ.get("HERMES_URL", "redis://localhost:6379/0")
    app.config.update(config or {})
    # One Emitter per process, shared by every request (its driver's send() is
    # thread-safe, and a driver made before a pre-fork server forks works in the children).
    app.extensions["hermes"] = Emitter(connect(app.config["HERMES_URL"]))

    @app.post("/signup")
    def signup() -> tuple[dict[str, str], int]:
        data = request.get_json(silent=True)
        if not isinstance(data, dict) or not data.get("email") or not data.get("name"):
            return {"error": "send a JSON object with email and name"}, 400
        message = Message("send-welcome", {"email": data["email"], "name": data["name"]})
        current_app.extensions["hermes"].emit(message)
        return {"queued": message.id}, 202

    return app
