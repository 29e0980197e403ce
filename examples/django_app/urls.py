from django.urls import path

from examples.django_app import views

urlpatterns = [
    path("signup", views.signup),
    path("orders", views.order),
    path("orders-async", views.order_async),
    path("receipts/<str:task_id>", views.receipt),
]
