"""The API reference covers every public module, the README stays a landing page, and the worst
defects issue 43 found in the docs do not come back."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.processes import python_env


def public_modules() -> set[str]:
    src = ROOT / "src"
    found = set()
    for path in (src / "stoker").rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts[1:]):
            found.add(".".join(parts))
    return found


def test_every_public_module_has_a_place_in_the_api_reference():
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    referenced = set(re.findall(r"^::: ([\w.]+)", pages, re.MULTILINE))
    assert public_modules() - referenced == set(), "add a `::: module` line to a docs/api page"
    assert referenced - public_modules() == set(), "the API reference names modules that do not exist"


def test_the_readme_is_a_landing_page_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make run" in readme and "make test" in readme
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def reader_pages() -> list[Path]:
    """The Markdown a reader sees: on GitHub and on the site (the API pages are mkdocstrings directives)."""
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")]
    return [p for p in pages if "api" not in p.relative_to(ROOT).parts[:2]]


def test_no_page_shows_an_include_line_or_an_escaped_pipe():
    # GitHub shows a snippet include (--8<--) as its raw line; the site shows \| inside a table's
    # code span as a backslash and a bar. Neither may reach a reader.
    for page in reader_pages():
        text = page.read_text()
        assert "--8<--" not in text, f"{page}: a snippet include line (inline the file and test it, below)"
        assert "\\|" not in text, f"{page}: an escaped pipe (the site shows it as \\|; reword the cell)"


def fenced_python_blocks(text: str) -> list[str]:
    return [m[1] for m in re.finditer(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)]


INLINED_PROGRAMS = {
    "docs/tutorial.md": "examples/quickstart.py",
    "docs/migration/from-tpuestimator.md": "examples/from_tpuestimator.py",
    "docs/migration/from-lightning.md": "examples/from_lightning.py",
    "docs/migration/from-huggingface.md": "examples/finetune_hf.py",
}


def test_programs_inlined_in_a_page_are_the_files_the_tests_run():
    # The pages show the whole program (readable on GitHub and on the site); the example files are
    # what `make run` and tests/test_examples.py run. A change to one must reach the other.
    for page, program in INLINED_PROGRAMS.items():
        blocks = fenced_python_blocks((ROOT / page).read_text())
        assert (ROOT / program).read_text() in blocks, f"{page} must show {program} exactly, in one ```python block"


DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MACHINE = re.compile(r"core|H200|GPU|CPU|any machine")


def test_the_readme_figures_are_one_short_row_each_with_its_date_and_machine():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Figures") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert len(rows) >= 5
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 3, row
        assert len(row) <= 200, f"a figures row is one short line: {row}"
        assert DATE.search(cells[2]) and MACHINE.search(cells[2]), f"say when and on what: {row}"
    assert "this morning" not in section and "latest" not in section


def test_the_tf_cnn_guide_and_bench_help_agree_that_data_dir_reads_tfrecords():
    # Both once said TFRecords could not be read, while stoker.data.images.tfrecord read them.
    help_text = subprocess.run(
        [sys.executable, "-m", "stoker", "bench", "--help"],
        env=python_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    data_dir = re.search(r"^  --data_dir DATA_DIR(.*?)^  --", help_text, re.MULTILINE | re.DOTALL)
    assert data_dir is not None and "TFRecord" in data_dir[1], help_text
    guide = (ROOT / "docs" / "migration" / "from-tf-cnn-benchmarks.md").read_text()
    data = guide[guide.index("## Data:") :]
    data = data[: data.index("\n## ", 1)]
    assert "TFRecord shards" in data and "train-*-of-*" in data
    for refusal in ("cannot read TFRecord", "not TFRecords", "TFRecord shards are not read", "decoded with Pillow in"):
        assert refusal not in guide, refusal


def test_every_runconfig_keyword_and_bench_flag_a_page_names_exists():
    # New pages (GPUs, performance, troubleshooting, clusters) name many switches; a renamed or
    # imagined one must fail here, not in a reader's run.
    import argparse
    import dataclasses

    import stoker
    from stoker.bench.cli import add_parser

    fields = {f.name for f in dataclasses.fields(stoker.RunConfig)}
    fields.add("tf_random_seed")  # TPUEstimator's RunConfig, in the migration guide's left column
    parser = add_parser(argparse.ArgumentParser().add_subparsers())
    flags = {option for action in parser._actions for option in action.option_strings}
    for page in reader_pages():
        text = page.read_text()
        for name in re.findall(r"RunConfig\((\w+)=", text):
            assert name in fields, f"{page}: RunConfig has no field {name!r}"
        for command in re.findall(r"stoker bench([^`|\n]*)", text):
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9_]*)", command):
                negated = "--" + flag[len("--no") :] if flag.startswith("--no") else flag
                assert flag in flags or negated in flags, f"{page}: stoker bench has no flag {flag}"


@pytest.mark.slow  # ~70 s here: every subcommand's --help in its own process
def test_the_command_line_page_is_the_commands_help():
    spec = importlib.util.spec_from_file_location("cli_help", ROOT / "docs" / "_ext" / "cli_help.py")
    assert spec is not None and spec.loader is not None
    cli_help = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli_help)
    assert (ROOT / "docs" / "cli.md").read_text() == cli_help.render(), (
        "docs/cli.md differs from the commands' --help: regenerate it with python docs/_ext/cli_help.py"
    )


def test_the_installation_page_lists_every_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    page = (ROOT / "docs" / "installation.md").read_text()
    assert [extra for extra in extras if f"| `{extra}` |" not in page] == []
