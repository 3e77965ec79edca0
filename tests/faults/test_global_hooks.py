"""torch's process-wide hooks (register_module_forward_pre_hook and its kind, register_optimizer_step_pre_hook and
its) are process state like threads or the environment: channels_last registers one while a run is open, and one left
registered runs in every later model. The process-state checks count them (accel.testing.trace.process_state, the
fault suite's injectors.process_state), and process_state_restored, the suite's autouse fixture, removes and says one
a test left."""
from pathlib import Path

import pytest
import torch
from injectors import process_state as fault_state
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook

import accel
from accel.testing import process_state_restored, tiny_loader
from accel.testing.trace import process_state
from accel.workloads import NormCNN


def nothing(*args):
    return None


def test_the_hook_channels_last_holds_while_its_run_is_open_is_process_state():
    model = NormCNN()
    before = process_state()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), ["channels_last"],
                           device="cpu")
    opened = process_state()
    run.close()
    assert opened[-1] != before[-1] and process_state() == before


@pytest.mark.parametrize("state", [process_state, fault_state])
@pytest.mark.parametrize("register", [register_module_forward_pre_hook, register_optimizer_step_post_hook])
def test_the_process_state_checks_count_every_process_wide_hook(state, register):
    before = state()
    handle = register(nothing)
    during = state()
    handle.remove()
    assert during != before and state() == before


@pytest.mark.parametrize("register", [register_module_forward_pre_hook, register_optimizer_step_post_hook])
def test_a_hook_left_in_the_block_is_removed_and_said_with_the_rest_put_back(register, monkeypatch):
    before = process_state()
    with pytest.warns(UserWarning, match="nothing at .* was left registered in torch's .*: removed"):
        with process_state_restored():
            register(nothing)
            torch.set_num_threads(torch.get_num_threads() + 1)
            monkeypatch.setenv("ACCEL_TEST_LEFT", "1")
    assert process_state() == before


LEAVING = """
import torch.nn.modules.module as module
from torch.nn.modules.module import register_module_forward_pre_hook


def left(module, args):
    return None


def test_leaves_a_hook():
    register_module_forward_pre_hook(left)


def test_after_it():
    assert left not in module._global_forward_pre_hooks.values()
"""


class Seen:
    """What a pytest run said: each test's outcome by phase, and the warnings it recorded."""

    def __init__(self):
        self.outcomes, self.warnings = {}, []

    def pytest_runtest_logreport(self, report):
        self.outcomes[(report.nodeid.split("::")[-1], report.when)] = report.outcome

    def pytest_warning_recorded(self, warning_message, when, nodeid, location):
        self.warnings.append((nodeid.split("::")[-1], str(warning_message.message)))


def test_the_suites_autouse_fixture_removes_and_says_a_hook_a_test_left(tmp_path, request):
    """A pytest run of its own, in this process, with the suite's conftest.py (its autouse fixture) as a plugin."""
    (conftest,) = [plugin for plugin in request.config.pluginmanager.get_plugins()
                   if getattr(plugin, "__file__", None) == str(Path(__file__).parents[1] / "conftest.py")]
    (tmp_path / "test_leaving_a_hook.py").write_text(LEAVING)
    seen = Seen()
    own = ["-q", "-p", "no:cacheprovider", "-p", "no:faulthandler", "--rootdir", str(tmp_path), str(tmp_path)]
    code = pytest.main(own, plugins=[conftest, seen])
    assert code == 0 and seen.outcomes[("test_after_it", "call")] == "passed", seen.outcomes
    assert [test for test, text in seen.warnings if "left registered" in text] == ["test_leaves_a_hook"], seen.warnings
