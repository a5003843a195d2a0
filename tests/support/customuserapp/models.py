"""A user model keyed by its username, a non-numeric string (as some projects' SSO users are)."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.contrib.auth.models import PermissionsMixin
from django.db import models


class Operator(AbstractBaseUser, PermissionsMixin):
    """A console operator whose primary key is ``username``."""

    username = models.CharField(max_length=150, primary_key=True)
    is_staff = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)

    objects = BaseUserManager()

    USERNAME_FIELD = "username"

    def __str__(self) -> str:
        return self.username
