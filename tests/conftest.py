"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests (`pytestmark = pytest.mark.usefixtures("one_thread")`): the
    models they export and quantize sum in one order, whatever the machine's core count."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
