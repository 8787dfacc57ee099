import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_process_state():
    """enable_determinism() flips process-wide switches; keep tests independent of their order."""
    threads = torch.get_num_threads()
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)
