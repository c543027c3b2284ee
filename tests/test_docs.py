"""The documentation cannot drift from the code: the settings reference is generated from the code's own
declarations and must match the committed page; every option a command's --help shows is in it; the site builds
with MkDocs in strict mode (a broken link or anchor fails); the README's links resolve and it stays short; no
user-facing page narrates how the project was made."""

from __future__ import annotations

import importlib.util
import csv
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator():
    return _generator()


@pytest.fixture(scope="module")
def rendered(generator) -> str:
    return generator.render()


def test_reference_matches_the_code(generator, rendered):
    committed = generator.PAGE.read_text()
    assert committed == rendered, "docs/pages/reference.md differs from the code's declarations: run `make docs`"


def test_code_page_matches_the_tree(generator):
    committed = generator.CODE_PAGE.read_text()
    assert committed == generator.render_code(), ("docs/pages/code.md differs from the packages' docstrings or "
                                                  "tests/test_layers.py: run `make docs`")


def test_every_option_help_shows_is_in_the_reference(generator, rendered):
    import click
    import typer

    from profkit.cli import app

    group = typer.main.get_command(app)
    ctx = click.Context(group, info_name="profkit", **(group.context_settings or {}))
    names = [opt for param in group.get_params(ctx) if param.get_help_record(ctx)
             for opt in (*param.opts, *param.secondary_opts)]
    for name, command in group.commands.items():
        assert f"### profkit {name}" in rendered
        sub = click.Context(command, info_name=name, parent=ctx)
        names += [opt for param in command.get_params(sub) if param.get_help_record(sub)
                  for opt in (*param.opts, *param.secondary_opts) if opt.startswith("-")]
    missing = sorted({n for n in names if not re.search(re.escape(n) + r"(?![\w-])", rendered)})
    assert not missing, f"options --help shows but the reference lacks: {missing}"


def test_every_method_and_setting_is_in_the_reference(rendered):
    from profkit.core.methods import METHODS, SETTINGS
    from profkit.core.presets import PRESETS
    from profkit.core.settings import RunSettings

    for name in (*METHODS, *PRESETS):
        assert f"`{name}`" in rendered, name
    for setting in SETTINGS.values():
        assert f"`{setting.option.flag}" in rendered, setting.option.flag
    for option, _ in RunSettings.options().values():
        assert f"`{option.flag}`" in rendered, option.flag


def test_the_site_builds_strict(tmp_path):
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(str(DOCS / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    build(config)  # strict: a warning (a broken link or anchor, a page missing from nav) aborts the build
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference.html").exists()


def test_readme_links_resolve_and_it_stays_short():
    text = README.read_text()
    words = len(text.split())
    assert words <= 1500, f"README.md is {words} words; the rest belongs in docs/"
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to a missing file: {target}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to a missing heading: {target}"


def test_the_readme_keeps_ci_commands():
    text = README.read_text()
    assert "make record" in text and "make test" in text
    assert (ROOT / ".ci" / "run").read_text().count("make test") >= 1


# Outside code spans (where a file name may appear): a session number or a batch nickname says how the project was
# made, not what the data is.
NARRATION = re.compile(r"\bsessions? \d+|\bthis session\b|\bfresh\d+\b", re.I)


def test_no_page_narrates_its_making():
    pages = [README, *sorted((DOCS / "pages").rglob("*.md"))]
    found = []
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in NARRATION.finditer(re.sub(r"`[^`]*`", "", line)):
                found.append(f"{page.relative_to(ROOT)}:{number}: {match.group(0)}")
    assert not found, "user-facing text narrates how it was made:\n" + "\n".join(found)


# A split of the published sets is named by what it holds (used, or held out from which sources), not by the batch
# it was gathered in; the split names become file names under reports/.
SPLIT_NAME = re.compile(r"(used|holdout|held-out)(-[a-z0-9]+)*")


def test_published_splits_are_named_by_their_sources():
    published = ROOT / "tests" / "data" / "published"
    for table in sorted(published.glob("*.csv")):
        with table.open(newline="") as rows:
            splits = {row.get("split") for row in csv.DictReader(rows)} - {None, ""}  # empty: a row not used, with why
        bad = sorted(s for s in splits if not SPLIT_NAME.fullmatch(s) or NARRATION.search(s.replace("-", " ")))
        assert not bad, f"{table.name}: split names that do not say what they hold: {bad}"
    reports = [p.name for p in (ROOT / "reports").rglob("*") if re.search(r"fresh|session", p.name)]
    assert not reports, f"report files named by a batch: {reports}"
