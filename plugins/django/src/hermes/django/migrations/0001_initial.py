"""The admin's two models, without tables (``managed = False``): nothing is created."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations, models


def _model(name: str, verbose_name: str, permissions: tuple[str, ...]) -> migrations.CreateModel:
    return migrations.CreateModel(
        name=name,
        fields=[
            (
                "id",
                models.AutoField(
                    auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                ),
            ),
        ],
        options={
            "verbose_name": verbose_name,
            "managed": False,
            "default_permissions": permissions,
        },
    )


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[migrations.CreateModel]] = [
        _model("FailedJob", "failed job", ("view", "change")),
        _model("Job", "job", ("view",)),
    ]
