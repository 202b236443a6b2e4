"""Fixtures shared by the test modules: sample factories and a field whose bytes fail mid-write."""

import pytest


class FailingBytes(bytes):
    """A sample field whose bytes cannot be produced: a failure (or Ctrl-C) in the middle of a write.

    Writers call ``bytes(value)`` (or read it through the buffer protocol after opening the file), so
    the write fails after it began. ``exc`` picks the exception, e.g. KeyboardInterrupt.
    """

    exc: type[BaseException] = RuntimeError

    def __bytes__(self):
        raise self.exc("interrupted")


@pytest.fixture
def failing_bytes():
    """``failing_bytes(payload, exc=RuntimeError)``: a FailingBytes that raises ``exc``."""

    def make(payload: bytes = b"x", exc: type[BaseException] = RuntimeError) -> FailingBytes:
        return type("Failing", (FailingBytes,), {"exc": exc})(payload)

    return make


@pytest.fixture
def byte_samples():
    """``byte_samples(n, ext="jpg", payload=b"x")``: n valid samples with distinct sizes and a label field."""

    def make(n: int, ext: str = "jpg", payload: bytes = b"x") -> list[dict]:
        return [
            {"__key__": f"k{i:04d}", ext: payload * (1 + (7 * i) % 701), "cls": str(i % 4).encode()} for i in range(n)
        ]

    return make


@pytest.fixture
def randomize_batchnorm():
    """Give every BatchNorm2d of a module non-trivial statistics and affine parameters, in place.

    Fresh BatchNorm layers (mean 0, var 1, weight 1, bias 0) fold into a convolution as the identity,
    so a fusion or re-parameterization that ignored them would still pass; these values would not.
    """
    from torch import nn

    def randomize(module: nn.Module) -> None:
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1.0, 1.0)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.5, 0.5)

    return randomize
