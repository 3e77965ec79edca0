"""The docs stay true: their code runs as written (the README's Quickstart, the EMA accelerator of lifecycle.md, the
plan forms of plan.md), every relative link and #anchor resolves, no file cites a source outside the repository,
and the docs stay short enough to read."""
import ast
import re
from pathlib import Path

import pytest

import accel

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS.rglob("*.md")])
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^()\s]+)\)")
CARDS = sorted((DOCS / "accelerators").glob("*.md"))
# all docs with the cards; the pages outside docs/accelerators/; the cards (issue 39)
WORDS_LIMIT, OUR_PAGES_LIMIT, CARDS_LIMIT = 20_000, 13_000, 6_000


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code: what a reader sees as links and headings."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The #anchors GitHub gives the page's headings: the heading's text (links and code as their text) in lower case,
    without punctuation but hyphens, spaces as hyphens; a repeated one gets -1, -2, ..."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", page.read_text()), re.M):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        found.add(next(f"{slug}-{n}" if n else slug for n in range(100) if (f"{slug}-{n}" if n else slug) not in found))
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto: are not the repository's
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(ROOT) if ROOT in resolved.parents else resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading gives #{anchor}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert not broken_links(page), broken_links(page)


def test_the_anchor_rules_are_githubs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# `plan=\"auto\"` in your own loop\n## Under faults: full disks, signals\n## A, b\n## A, b\n"
                    "```\n# not a heading\n```\n## [The cards](x.md) and `keeps`\n")
    assert anchors(page) == {"planauto-in-your-own-loop", "under-faults-full-disks-signals", "a-b", "a-b-1",
                             "the-cards-and-keeps"}
    (tmp_path / "other.md").write_text("[ok](page.md#a-b-1) [gone](page.md#not-a-heading) [lost](nowhere.md) "
                                       "`[code](skipped.md)` [web](https://example.com/x)\n")
    assert broken_links(tmp_path / "other.md") == ["page.md#not-a-heading: no heading gives #not-a-heading",
                                                   f"nowhere.md: no {tmp_path / 'nowhere.md'}"]


def citing_notes(root: Path = ROOT) -> set[str]:
    """The files of the repository that cite NOTES, the field notes kept outside it (docs/machines.md is the page)."""
    files = [*root.glob("*.*"), *(path for folder in ("accel", "tests", "benchmarks", "examples", "docs", ".ci")
                                  for path in (root / folder).rglob("*.*") if "__pycache__" not in path.parts)]
    files = [path for path in files if path.suffix in {".md", ".py", ".toml", ".sh", ".yml", ".yaml"}
             and path != Path(__file__).resolve()]
    return {str(f.relative_to(root)) for f in files if re.search(r"\bNOTES\b", f.read_text())}


def test_no_file_cites_notes_outside_the_repository(tmp_path):
    assert not citing_notes(), sorted(citing_notes())
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench.py").write_text('"""Measured on the Zen 3 (NOTES.md)."""\n')
    (tmp_path / "README.md").write_text("The notes, in docs/machines.md.\n")
    assert citing_notes(tmp_path) == {"benchmarks/bench.py"}


def accelerator_docstring(card: Path) -> str:
    module = ROOT / "accel" / "accelerators" / f"{card.stem}.py"
    return ast.get_docstring(ast.parse((module if module.exists() else module.with_suffix("") / "__init__.py")
                                       .read_text())) or ""


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.stem)
def test_an_accelerators_docstring_says_what_and_why_and_points_at_its_card(card):
    """Issue 39: what it does, when it helps or hurts in words, what it keeps, in 10 lines; numbers on the card."""
    docstring = accelerator_docstring(card)
    assert f"docs/accelerators/{card.name}" in docstring and len(docstring.splitlines()) <= 10, docstring


def words(pages) -> int:
    return sum(len(page.read_text().split()) for page in pages)  # as wc -w counts them


def test_our_pages_stay_short():
    ours = [p for p in PAGES if DOCS / "accelerators" not in p.parents and p.name != "CHANGELOG.md"]
    assert words(ours) < OUR_PAGES_LIMIT, words(ours)


def test_all_the_docs_are_read_in_an_afternoon():
    pages = [p for p in PAGES if p.name != "CHANGELOG.md"]
    assert words(pages) < WORDS_LIMIT, words(pages)


def test_the_cards_say_what_a_user_needs_and_no_more():
    assert len(CARDS) >= 13 and words(CARDS) < CARDS_LIMIT, words(CARDS)


@pytest.mark.slow
def test_the_quickstart_of_the_readme_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))  # plan="auto" remembers its answer there, not in yours
    block = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[0]
    namespace = {}
    exec(block, namespace)
    assert namespace["run"].steps == 3 * len(namespace["loader"]) and namespace["run"].closed
    plan = ["threads", "channels_last", "fused_optimizer", "amp"]  # the plan of the README's sample report
    namespace = {}
    exec(block.replace('plan="auto"', f"plan={plan!r}"), namespace)
    report = namespace["run"].report
    assert [row.name for row in report.rows] == plan
    assert {row.name for row in report.rows if row.status == "applied"} >= {"threads", "channels_last",
                                                                            "fused_optimizer"}


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
