from django.urls import path

from examples.django_app import views

urlpatterns = [path("signup", views.signup)]
