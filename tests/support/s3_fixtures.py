"""Module-scoped S3 fixtures shared by the URL tests: ``proxy``, a
:class:`~tests.support.s3proxy.FaultProxy` in front of the module's moto server (the
``endpoint`` fixture of ``tests/e2e/test_s3.py``, imported beside these), and ``px``, the same
proxy with its log and fault policy reset around each test. Import both into a test module
with ``endpoint``."""

from __future__ import annotations

import pytest

from .s3proxy import FaultProxy


@pytest.fixture(scope="module")
def proxy(endpoint):
    """A fault proxy in front of the module's moto server, for the whole module."""
    px = FaultProxy(endpoint)
    yield px
    px.close()


@pytest.fixture
def px(proxy):
    """The module's proxy with an empty log and no faults, before and after the test."""
    proxy.reset()
    yield proxy
    proxy.reset()
