import pytest
import torch

from verify_attn import ops, registry
from verify_attn.measure import skip_reason

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session", autouse=True)
def extension():
    ops.load()  # build once (cached by content) before any test


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def require(impl: str, device: str, inputs=None) -> None:
    """Skip, with the registry's reason, where impl cannot run on this device or these inputs."""
    reason = ops.unsupported(impl, device) if inputs is None else skip_reason(impl, None, inputs)
    if reason:
        pytest.skip(reason)


COMPILED = [n for n, i in registry.IMPLS.items() if i.compiled]
