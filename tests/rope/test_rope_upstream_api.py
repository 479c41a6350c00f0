"""Upstream's rope API as listed in tests/upstream_api.toml: every provided name has upstream's
parameter names, order and defaults; every missing one is listed in the README."""

import pytest

from conftest import check_upstream_api, upstream_api

ENTRIES = upstream_api("rope")


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_upstream_api(entry):
    check_upstream_api(entry)
