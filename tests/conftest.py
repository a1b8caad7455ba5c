import pytest
import torch

from verify_attn import ops

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session", autouse=True)
def extension():
    ops.load()  # build once (cached by content) before any test


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
