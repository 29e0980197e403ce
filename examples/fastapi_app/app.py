"""A FastAPI app whose request handler emits a job and answers at once.

HERMES_URL=redis://localhost:6379/0 uvicorn examples.fastapi_app.app:app
hermes worker --url redis://localhost:6379/0 --handlers examples.fastapi_app.worker:handlers
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from pydantic import BaseModel

from hermes.core import Emitter, Message, connect


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One driver per process, connected at start-up and closed at shutdown.
    # Its send() is thread-safe, so every request shares it.
    with connect(os.environ.get("HERMES_URL", "redis://localhost:6379/0")) as driver:
        app.state.emitter = Emitter(driver)
        yield


app = FastAPI(lifespan=lifespan)


class Signup(BaseModel):
    email: str
    name: str


@app.post("/signup", status_code=202)
async def signup(signup: Signup, request: Request) -> dict[str, str]:
    message = Message("send-welcome", {"email": signup.email, "name": signup.name})
    # An async endpoint runs on the event loop: emit_async sends from a thread,
    # so other requests are served while Redis answers. (A plain `def` endpoint
    # already runs in a thread and calls emitter.emit(message).)
    await request.app.state.emitter.emit_async(message)
    return {"queued": message.id}
