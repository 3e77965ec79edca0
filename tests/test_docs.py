"""The code in docs/plan.md runs as written."""
import re
from pathlib import Path

import accel

DOC = Path(__file__).resolve().parents[1] / "docs" / "plan.md"


def test_custom_accelerator_example_in_the_docs_works():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    namespace = {}
    try:
        exec(blocks[1], namespace)  # registers FreezeBackbone
        exec(blocks[2], namespace)
        namespace["test_freeze_backbone"]()
        assert accel.Plan(["freeze_backbone", "amp"]).names() == ["freeze_backbone", "amp"]
    finally:
        accel.unregister("freeze_backbone")


def test_the_plan_forms_in_the_docs_are_one_plan(tmp_path):
    text = DOC.read_text()
    toml = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    yaml = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    (tmp_path / "plan.toml").write_text(toml)
    (tmp_path / "plan.yaml").write_text(yaml)
    listed = accel.Plan(["threads", "loader", "channels_last", {"compile": {"mode": "default"}}])
    assert accel.Plan(tmp_path / "plan.toml").names() == accel.Plan(tmp_path / "plan.yaml").names() == listed.names()
