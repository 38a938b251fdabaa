"""The Kubernetes client's HTTP session: per-request proxy and netrc lookups are skipped only where there are none."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from muster.daemon.k8s.client import skip_environment_lookups

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "NETRC")


@pytest.fixture
def bare_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No proxy variables, and a home without a .netrc; returns the home."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


async def test_without_proxies_or_netrc_the_lookups_are_skipped(bare_environment: Path) -> None:
    """Nothing to find: the session stops looking for it on every request."""
    async with ApiClient(Configuration()) as api:
        assert skip_environment_lookups(api)
        assert not api.rest_client.pool_manager.trust_env


@pytest.mark.parametrize("setting", ["proxy", "netrc"])
async def test_a_proxy_or_a_netrc_keeps_the_lookups(
    bare_environment: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    """A proxy in the environment, or a ~/.netrc, is still honoured as kubernetes-asyncio does."""
    if setting == "proxy":
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    else:
        (bare_environment / ".netrc").write_text("machine example login u password p\n")
    async with ApiClient(Configuration()) as api:
        assert not skip_environment_lookups(api)
        assert api.rest_client.pool_manager.trust_env
