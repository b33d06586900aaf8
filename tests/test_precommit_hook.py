"""The pre-commit hook (`.pre-commit-hooks.yaml`): its entry, run on plan files as
pre-commit would run it, fails a plan that does not fit. pre-commit itself is not needed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.plan_files import GPT3, ROOT, too_big


def _hook() -> dict[str, Any]:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    (hook,) = [h for h in hooks if h["id"] == "budget-check"]
    assert hook["language"] == "python"
    return dict(hook)


def _run_entry(files: list[Path]) -> subprocess.CompletedProcess[str]:
    """The hook's entry with the changed files appended, as pre-commit runs it."""
    program, *args = shlex.split(_hook()["entry"])
    assert program == "budget"
    found = shutil.which("budget", path=str(Path(sys.executable).parent))
    command = [found] if found else [sys.executable, "-m", "budget"]
    return subprocess.run(
        [*command, *args, *map(str, files)], capture_output=True, text=True, check=False
    )


def test_the_hook_selects_plan_files() -> None:
    files = re.compile(_hook()["files"])
    assert files.search("plans/gpt3-175b.yaml")
    assert files.search("deploy/plans/llama.yml")
    assert not files.search(".github/workflows/ci.yaml")
    assert not files.search("budget/cli.py")


def test_the_hook_passes_a_plan_that_fits() -> None:
    result = _run_entry([GPT3])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_hook_fails_a_plan_that_does_not_fit(tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    result = _run_entry([GPT3, too_big(plans)])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "does not fit" in result.stdout
    assert "Traceback" not in result.stderr
