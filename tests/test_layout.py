"""The tests mirror the source (docs/layout.md): every package of ``src/stoker`` has its tests in
the same place under ``tests/``, and every folder of tests is named after a package, so a
reader who opens ``src/stoker/X/`` finds its tests in ``tests/X/``."""

from __future__ import annotations

from pathlib import Path

from helpers.paths import ROOT, TESTS

SRC = ROOT / "src" / "stoker"
#: folders of tests that mirror no package: the shared helpers
NOT_MIRRORS = {"helpers"}


def packages(src: Path) -> set[str]:
    """The public packages under ``src`` as paths relative to it (``data/images``); a private one
    (``data/_workers``) is tested with its parent."""
    found = set()
    for init in src.rglob("__init__.py"):
        rel = init.parent.relative_to(src)
        if rel.parts and not any(part.startswith("_") for part in rel.parts):
            found.add(rel.as_posix())
    return found


def folders_of_tests(tests: Path) -> set[str]:
    """The folders under ``tests`` that hold test files, relative to it."""
    return {p.parent.relative_to(tests).as_posix() for p in tests.rglob("test_*.py") if p.parent != tests}


def test_every_package_has_a_folder_of_tests():
    missing = sorted(packages(SRC) - folders_of_tests(TESTS))
    assert not missing, f"packages without tests/<package>/: {missing}"


def test_every_folder_of_tests_is_named_after_a_package():
    strays = sorted(f for f in folders_of_tests(TESTS) - packages(SRC) if f.split("/")[0] not in NOT_MIRRORS)
    assert not strays, f"tests/ folders that mirror no package of src/stoker: {strays}"


def test_the_checks_find_a_missing_and_a_stray_folder(tmp_path: Path):
    src, tests = tmp_path / "src", tmp_path / "tests"
    for package in ("a", "a/b", "a/_private", "c"):
        (src / package).mkdir(parents=True)
        (src / package / "__init__.py").write_text("")
    for folder in ("a", "d"):
        (tests / folder).mkdir(parents=True)
        (tests / folder / "test_x.py").write_text("")
    assert packages(src) == {"a", "a/b", "c"}
    assert packages(src) - folders_of_tests(tests) == {"a/b", "c"}
    assert folders_of_tests(tests) - packages(src) == {"d"}


def duplicate_test_names(tests: Path) -> dict[str, list[str]]:
    """Test file names used in more than one folder under ``tests``: name -> those folders."""
    folders: dict[str, list[str]] = {}
    for p in sorted(tests.rglob("test_*.py")):
        folders.setdefault(p.name, []).append(p.parent.relative_to(tests).as_posix())
    return {name: where for name, where in folders.items() if len(where) > 1}


def test_every_test_file_name_is_unique():
    # The folders of tests are not packages: pytest imports each file by its name alone, so a second
    # file of the same name stops the collection of the whole suite ("import file mismatch").
    assert not duplicate_test_names(TESTS)


def test_the_check_finds_a_name_in_two_folders(tmp_path: Path):
    for path in ("a/test_x.py", "b/test_x.py", "c/test_y.py"):
        (tmp_path / path).parent.mkdir()
        (tmp_path / path).write_text("")
    assert duplicate_test_names(tmp_path) == {"test_x.py": ["a", "b"]}
