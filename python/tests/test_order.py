"""dstk.order_indices for more samples than memory holds: a MemoryError that says so, not a crash."""
import pytest

import dstk


@pytest.mark.parametrize("samples", [2**61, 2**64 - 1,  # 8 bytes a sample wraps around 2^64
                                     2**61 - 1])  # the largest that does not: no allocator gives 2^64 - 8 bytes
def test_more_samples_than_memory_raise_memory_error(samples):
    with pytest.raises(MemoryError, match=f"order_indices of {samples} samples needs .* ask for fewer samples"):
        dstk.order_indices(samples, 0, "sequential")
