"""The example's data: an order, written in the same transaction that enqueues its receipt."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    number = models.PositiveIntegerField(unique=True)
    email = models.EmailField()
    created = models.DateTimeField(auto_now_add=True)
