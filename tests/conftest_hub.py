"""Pytest fixtures for talking to :class:`fake_hub.FakeHub` with the real ``huggingface_hub``.

Import them from ``conftest.py`` (``from conftest_hub import fake_hub, hf_offline, no_internet, no_retry_wait``)
or list ``conftest_hub`` in the root ``pytest_plugins``.

* ``no_internet``: name lookups of anything but loopback fail, so no test can reach huggingface.co.
* ``fake_hub``: a started :class:`FakeHub`; the environment (for subprocesses) and the
  ``huggingface_hub.constants`` read at import (for in-process calls) point at it, with a
  per-test ``HF_HOME``, no token, telemetry and progress bars off.
* ``no_retry_wait``: the client's retry backoff (1+2+4+8+8 s for an unreachable server) does
  not sleep; the retries still happen. ``fake_hub`` uses it.
* ``hf_offline``: turns on ``HF_HUB_OFFLINE`` (after ``fake_hub`` set things up); request it mid-test
  with ``request.getfixturevalue("hf_offline")`` to go offline after some online calls.
"""

from __future__ import annotations

import importlib
import ipaddress
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_hub import FakeHub

_TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH")
_CACHE_VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE")


def _is_loopback(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if host in (None, "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_internet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse DNS lookups (hence connections) for any host that is not loopback."""
    real_getaddrinfo = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_loopback(host):
            raise socket.gaierror(f"BLOCKED non-loopback lookup: {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)


def point_hub_client_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, hf_home: Path) -> None:
    """Aim ``huggingface_hub`` (this process and subprocesses) at ``endpoint`` with ``hf_home`` as cache."""
    from huggingface_hub import constants

    hf_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # the module, not the class

    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(hf_home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in (*_TOKEN_VARS, *_CACHE_VARS, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    # These constants are computed once, when huggingface_hub is first imported.
    patched = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HUGGINGFACE_HUB_CACHE": str(hf_home / "hub"),
        "HF_XET_CACHE": str(hf_home / "xet"),
        "HF_ASSETS_CACHE": str(hf_home / "assets"),
        "HF_TOKEN_PATH": str(hf_home / "token"),
        "HF_STORED_TOKENS_PATH": str(hf_home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(hf_home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
    }
    for name, value in patched.items():
        if hasattr(constants, name):
            monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(hf_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    # `huggingface_hub.create_repo`, `upload_folder`, ... are methods of one HfApi made when
    # `huggingface_hub.hf_api` is first imported: its endpoint is frozen at that moment.
    monkeypatch.setattr(importlib.import_module("huggingface_hub.hf_api").api, "endpoint", endpoint)


class _TimeWithoutSleep:
    """The ``time`` module, except that ``sleep`` returns at once."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        del seconds


@pytest.fixture
def no_retry_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip the waits of huggingface_hub's ``http_backoff`` (only its own ``time`` is patched)."""
    monkeypatch.setattr(importlib.import_module("huggingface_hub.utils._http"), "time", _TimeWithoutSleep())


@pytest.fixture
def fake_hub(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_internet: None, no_retry_wait: None
) -> Iterator[FakeHub]:
    """A running :class:`FakeHub` that ``huggingface_hub`` uses by default, with a fresh ``HF_HOME``."""
    hub = FakeHub().start()
    point_hub_client_at(monkeypatch, hub.endpoint, tmp_path / "hf_home")
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def hf_offline(monkeypatch: pytest.MonkeyPatch, fake_hub: FakeHub) -> None:
    """``HF_HUB_OFFLINE=1`` in the environment and in ``huggingface_hub.constants`` (set after ``fake_hub``)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


__all__ = ["fake_hub", "hf_offline", "no_internet", "no_retry_wait", "point_hub_client_at"]
