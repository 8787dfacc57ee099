"""Tensors are handled as zero-copy bit views; torch tensors (bf16 included) when torch is installed."""

from __future__ import annotations

import numpy as np
import pytest

from relayrl.weight_sync import bits
from relayrl.weight_sync.errors import WeightSyncError


def test_numpy_views_share_memory_and_name_their_dtype():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    view = bits.bits_view(array)
    assert view.dtype == np.uint8 and view.size == 24 and np.shares_memory(view, array)
    assert bits.dtype_name(array) == "float32" and bits.element_bytes("float32") == 4
    view[:4] = np.frombuffer(np.float32(7.5).tobytes(), np.uint8)
    assert array[0, 0] == 7.5
    with pytest.raises(WeightSyncError, match="w.T: a zero-copy view needs a C-contiguous"):
        bits.bits_view(array.T, name="w.T")


def test_element_bytes_of_names_numpy_lacks():
    assert bits.element_bytes("bfloat16") == 2 and bits.element_bytes("float8_e4m3fn") == 1
    with pytest.raises(WeightSyncError, match="unknown dtype 'float3'"):
        bits.element_bytes("float3")


def test_torch_bfloat16_tensors_are_viewed_without_copies():
    torch = pytest.importorskip("torch", reason="torch is optional; this test covers its zero-copy views")
    tensor = torch.randn(4, 5).to(torch.bfloat16)
    view = bits.bits_view(tensor, name="w")
    assert bits.dtype_name(tensor) == "bfloat16" and view.size == 40
    assert np.array_equal(view.view(np.uint16), tensor.view(torch.int16).numpy().reshape(-1).view(np.uint16))
    replacement = torch.randn(4, 5).to(torch.bfloat16)
    bits.write_bits(tensor, bits.bits_view(replacement.clone()), name="w")
    assert torch.equal(tensor.view(torch.int16), replacement.view(torch.int16))
    delta = np.zeros(40, np.uint8)
    delta[1] = 0x80  # the sign bit of the first element
    bits.xor_bits_into(tensor, delta)
    assert tensor[0, 0].item() == -replacement[0, 0].item()
    out = np.empty(40, np.uint8)
    bits.copy_bits_into(tensor.t(), out)  # a non-contiguous tensor is copied, not viewed
    assert np.array_equal(out.view(np.uint16), tensor.t().contiguous().view(torch.int16).numpy().reshape(-1).view(np.uint16))
