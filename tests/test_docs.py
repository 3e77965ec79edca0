"""The code in the docs runs as written: the EMA accelerator of docs/lifecycle.md and the plan forms of plan.md."""
import re
from pathlib import Path

import accel

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_ema_example_of_the_lifecycle_guide_works(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "lifecycle.md").read_text(), re.S)
    namespace = {}
    try:
        exec(blocks[0], namespace)  # registers EMA
        exec(blocks[1], namespace)
        namespace["test_ema"](tmp_path)
        assert accel.Plan(["ema", "amp", "grad_accumulation"]).names() == ["amp", "ema", "grad_accumulation"]
    finally:
        accel.unregister("ema")


def test_the_plan_forms_in_the_docs_are_one_plan(tmp_path):
    text = (DOCS / "plan.md").read_text()
    toml = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    yaml = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    (tmp_path / "plan.toml").write_text(toml)
    (tmp_path / "plan.yaml").write_text(yaml)
    listed = accel.Plan(["threads", "loader", "channels_last", {"compile": {"mode": "default"}}])
    assert accel.Plan(tmp_path / "plan.toml").names() == accel.Plan(tmp_path / "plan.yaml").names() == listed.names()
