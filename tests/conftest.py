import pytest

from accel.testing import process_state_restored


@pytest.fixture(autouse=True)
def _restore_process_state():
    """Accelerators like threads change process-wide state; give every test a clean slate."""
    with process_state_restored():
        yield
