"""operator/k8s.py without a server: errors become ApiError, calls leave the
event loop free, and apply refuses what it cannot apply."""

from __future__ import annotations

import asyncio
import threading

import pytest
import urllib3
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from runlease.client import ApiError
from runlease.operator.k8s import Kubernetes


@pytest.fixture
async def kube() -> Kubernetes:
    configuration = k.Configuration(host="http://127.0.0.1:9")
    return Kubernetes(configuration, timeout_s=1)


def fails(exc: Exception) -> object:
    def method(*args: object, **kwargs: object) -> object:
        raise exc
    return method


@pytest.mark.parametrize(
    ("raised", "status"),
    [(ApiException(status=404, reason="Not Found"), 404),
     (ApiException(status=409, reason="Conflict"), 409),
     (urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"), 0),
     (ConnectionRefusedError("refused"), 0)],
)
async def test_errors_of_a_call_are_api_errors(kube: Kubernetes, raised: Exception,
                                               status: int) -> None:
    with pytest.raises(ApiError) as caught:
        await kube.call(fails(raised))  # type: ignore[arg-type]
    assert caught.value.status == status
    await kube.close()


async def test_a_call_runs_off_the_event_loop_with_a_request_timeout(kube: Kubernetes) -> None:
    release = threading.Event()
    seen: dict[str, object] = {}

    def blocking(**kwargs: object) -> str:
        seen["thread"] = threading.current_thread().name
        seen["timeout"] = kwargs.get("_request_timeout")
        release.wait(10)
        return "done"

    call = asyncio.ensure_future(kube.call(blocking))
    # The loop goes on while the call blocks its thread.
    await asyncio.to_thread(lambda: None)
    assert not call.done()
    release.set()
    assert await call == "done"
    assert str(seen["thread"]).startswith("runlease-k8s")
    assert seen["timeout"] == (5.0, 1)
    await kube.close()


async def test_apply_refuses_an_object_it_has_no_api_for(kube: Kubernetes) -> None:
    with pytest.raises(ValueError, match="cannot apply"):
        await kube.apply(k.V1ConfigMap(metadata=k.V1ObjectMeta(name="x", namespace="y")))
    await kube.close()
