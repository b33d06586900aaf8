"""What budget writes is whole or absent, and paths the system cannot look up are errors in
budget's words (hostile audit: tracebacks, a cut-off plan over the old one, 23 plan files
left behind by a failed --write-plans, a named pipe that hung the reader)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budget.cli import app
from budget.files import exists, unwritable, write_all, write_atomically
from budget.plan.load import load_plan
from tests.plan_files import GPT3, ROOT

DATA = ROOT / "tests" / "data"

runner = CliRunner()


def test_a_failed_write_leaves_the_old_file_and_no_stray_one(tmp_path: Path) -> None:
    target = tmp_path / "best.yaml"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o640)

    def half(staged: Path) -> None:
        staged.write_text("cut o", encoding="utf-8")
        raise OSError(27, "File too large")

    with pytest.raises(OSError, match="File too large"):
        write_atomically(target, half)
    assert target.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml"]
    write_atomically(target, "new\n")
    assert target.read_text(encoding="utf-8") == "new\n"
    assert target.stat().st_mode & 0o777 == 0o640  # the file it replaced keeps its mode


def test_a_set_of_files_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").mkdir()  # a folder where the second file should go
    files = [(tmp_path / name, f"{name}\n") for name in ("a.yaml", "b.yaml", "c.yaml")]
    with pytest.raises(IsADirectoryError) as caught:
        write_all(files)
    assert caught.value.filename == str(tmp_path / "b.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.yaml"]
    (tmp_path / "b.yaml").rmdir()
    write_all(files)
    assert [(p.read_text(encoding="utf-8")) for p, _ in files] == [
        "a.yaml\n",
        "b.yaml\n",
        "c.yaml\n",
    ]


def test_a_path_the_system_cannot_look_up_names_no_file() -> None:
    assert not exists(Path("a" * 300 + ".yaml"))  # over NAME_MAX: ENAMETOOLONG
    assert not exists(Path("plan\0.yaml"))  # a NUL byte: ValueError
    assert exists(GPT3)


def test_write_plans_into_a_folder_that_cannot_take_one_writes_none(tmp_path: Path) -> None:
    (tmp_path / "gpt-3-175b-128-gpus.yaml").mkdir()
    result = runner.invoke(app, ["validate-model", "--write-plans", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.startswith(f"budget: error: --write-plans {tmp_path}: cannot write ")
    assert "gpt-3-175b-128-gpus.yaml: is a directory" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["gpt-3-175b-128-gpus.yaml"]


@pytest.mark.parametrize(
    "args",
    [
        ["a" * 300 + ".yaml"],
        ["search", str(GPT3), "--write", "a" * 300 + ".yaml"],
        ["validate-model", "--write-plans", "a" * 300],
    ],
    ids=["plan", "search --write", "validate-model --write-plans"],
)
def test_a_file_name_longer_than_the_system_allows_is_an_error(args: list[str]) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "budget", *args], capture_output=True, text=True, cwd=ROOT
    )
    assert process.returncode == 2 and "Traceback" not in process.stderr
    assert process.stderr.count("error") == 1
    assert not any(p.name.startswith("aaaa") for p in ROOT.iterdir())


def test_a_config_path_with_a_nul_byte_is_a_problem_at_its_key(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    text = GPT3.read_text(encoding="utf-8")
    start = text.index("model:")
    end = text.index("\nbatch:")
    plan.write_text(
        text[:start] + 'model: {hf_config: "x.json\\0y"}' + text[end:], encoding="utf-8"
    )
    result = runner.invoke(app, ["validate", str(plan)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr == (
        f"{plan}:17:20: error: $.model.hf_config: '{tmp_path}/x.json\\x00y' is not a file "
        "name: it holds a NUL byte\n"
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_no_one_writes_to_is_read_as_empty_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.yaml"
    os.mkfifo(fifo)
    process = subprocess.run(
        [sys.executable, "-m", "budget", str(fifo)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,  # the reader once blocked in open() for ever
    )
    assert process.returncode == 2
    assert (
        process.stderr == f"{fifo}:1:1: error: $: a plan is a mapping of keys (name, model, "
        "batch, ...); this file holds nothing\n"
    )


def test_a_write_goes_through_a_symbolic_link_and_stops_at_a_read_only_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As open() writes: the file a link names is replaced and the link stays (a rename
    over the link replaced the link itself; review); a loop of links is an error; a file
    without write permission is refused (`os.access` stands in for a non-root user)."""
    real = tmp_path / "best.yaml"
    real.write_text("old\n", encoding="utf-8")
    link = tmp_path / "current.yaml"
    link.symlink_to(real.name)
    write_atomically(link, "new\n")
    assert link.is_symlink() and real.read_text(encoding="utf-8") == "new\n"
    (tmp_path / "l1").symlink_to("l2")
    (tmp_path / "l2").symlink_to("l1")
    with pytest.raises(OSError, match="symbolic links"):
        write_atomically(tmp_path / "l1", "x\n")
    assert (tmp_path / "l1").is_symlink()
    monkeypatch.setattr("budget.files.os.access", lambda path, mode: False)
    with pytest.raises(PermissionError):
        write_atomically(real, "newer\n")
    assert real.read_text(encoding="utf-8") == "new\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_pipe_or_a_device_is_written_into_not_replaced(tmp_path: Path) -> None:
    """`--write /dev/stdout` or a pipe: a rename would put a regular file in its place (as
    root, over /dev/null itself); the data goes into it as it stands."""
    fifo = tmp_path / "out.yaml"
    os.mkfifo(fifo)
    with subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True) as reader:
        write_atomically(fifo, "plan\n")
        assert reader.communicate(timeout=30)[0] == "plan\n"
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["out.yaml"]


def test_a_plan_written_through_a_link_reads_its_config_by_either_name(tmp_path: Path) -> None:
    """The plan lands in the file the link names, its hf_config relative to that file's
    folder, and a plan reads a relative hf_config from its file's own folder, through a
    link too: both names of the written plan budget the same model (review: one failed)."""
    source = tmp_path / "src"
    source.mkdir()
    config = DATA / "hf" / "llama3-70b" / "config.json"
    (source / "config.json").write_bytes(config.read_bytes())
    text = (DATA / "llama3-70b-hf.yaml").read_text(encoding="utf-8")
    (source / "p.yaml").write_text(text.replace("hf/llama3-70b/config.json", "config.json"))
    deep = tmp_path / "out" / "deep"
    deep.mkdir(parents=True)
    link = tmp_path / "link.yaml"
    link.symlink_to(deep / "g.yaml")
    args = ["search", str(source / "p.yaml"), "--tp", "8", "--pp", "4", "--micro", "1"]
    result = runner.invoke(app, [*args, "--zero", "1", "--top", "1", "--write", str(link)])
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and (deep / "g.yaml").is_file()
    counts = {load_plan(p).model.layers for p in (link, deep / "g.yaml")}
    assert counts == {80}
    dangling = tmp_path / "d.yaml"
    dangling.symlink_to(tmp_path / "nofolder" / "new.yaml")
    refused = runner.invoke(app, [*args, "--write", str(dangling)])
    assert refused.exit_code == 2
    assert refused.stderr == (
        f"budget: error: --write {dangling}: there is no folder {tmp_path / 'nofolder'}\n"
    )


def test_a_name_that_is_not_utf8_can_be_written(tmp_path: Path) -> None:
    """A name of bytes that are no UTF-8 (Python holds them as surrogates) is measured as
    the file system takes it: `search --write $'\\xfe.yaml'` ended in an encoding error where
    `plot -o` wrote the same name (an audit)."""
    name = os.fsdecode(b"\xfe.yaml")
    assert unwritable(tmp_path / name) is None
    assert "too long" in (unwritable(tmp_path / os.fsdecode(b"\xfe" * 300)) or "")
