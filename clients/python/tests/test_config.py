"""Configuration checked before anything is sent."""

from __future__ import annotations

import pytest

from oncekv import Client, ConfigError, OncekvError, OutcomeUnknown


def test_endpoints_and_tls():
    assert Client("a:1, b:2").endpoints == ["a:1", "b:2"]
    assert not Client(["http://a:1"]).uses_tls
    assert Client(["https://a:1"]).uses_tls
    assert Client(["a:1"], ca_cert=b"").uses_tls
    for wrong in (
        dict(endpoints=[]),
        dict(endpoints="a:1", user="alice"),
        dict(endpoints="a:1", ca_cert=b"", cert=b"x"),
        dict(endpoints="a:1", cert=b"x", key=b"y"),
    ):
        with pytest.raises(ConfigError):
            Client(**wrong)


def test_only_an_unknown_outcome_may_have_applied():
    assert OutcomeUnknown((1, 2), 3).not_applied is False
    assert ConfigError("x").not_applied is True
    assert issubclass(OutcomeUnknown, OncekvError)
