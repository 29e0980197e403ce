"""The admin, and two async views: one enqueues a task, one answers at once."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path

from hermes_django_tests.shop.tasks import add


async def enqueue(request: HttpRequest) -> JsonResponse:
    result = await add.aenqueue(1, 2)
    return JsonResponse({"task": result.id}, status=202)


async def ping(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"pong": True})


urlpatterns = [path("admin/", admin.site.urls), path("enqueue", enqueue), path("ping", ping)]
