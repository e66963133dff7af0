"""Outputs are regular files or nothing (issue 37): an output path that is a device node, a FIFO,
a socket or a symlink pointing outside the output's directory is refused with one error line
before anything is written (an atomic rename would replace it: as root `convert --out
/dev/null` replaced /dev/null with a regular file). Commands that stream arrays (`run` /
`reference` --output, --routing, --logits) write into an existing character device or FIFO.

The real /dev/null is never a target here: the device cases use a device node made in tmp_path
(root) or a mocked stat."""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess

import numpy as np
import pytest
from colibri import paths
from colibri.errors import OutputError
from colibri.frontends.load import save_npy
from colibri.frontends.seed import make_toy, write_seed
from colibri.paths import check_output_file, write_file_atomic

Cli = Callable[..., CompletedProcess[str]]


def assert_one_line_error(proc: CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("colibri: error: "), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    write_seed(make_toy(), tmp_path / "toy")
    return tmp_path / "toy" / "model.bin"


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return p


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    p = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    yield p
    s.close()


@pytest.fixture
def outside_link(tmp_path: Path) -> Path:
    """out/link.clb -> a file outside out/."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "out").mkdir()
    link = tmp_path / "out" / "link.clb"
    link.symlink_to(victim)
    return link


@pytest.fixture
def device(tmp_path: Path) -> Path:
    """A character device node (1, 3: the null device's numbers) in tmp_path: root only."""
    p = tmp_path / "null"
    try:
        os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node: {exc}")
    return p


def _convert_args(toy: Path, out: Path) -> list[str]:
    return ["convert", str(toy), "--out", str(out)]


@pytest.mark.parametrize("kind", ["fifo", "sock", "outside_link", "device"])
def test_convert_refuses_special_outputs(
    cli: Cli, toy: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    target: Path = request.getfixturevalue(kind)
    before = os.lstat(target)
    proc = cli(*_convert_args(toy, target), check=False)
    want = {
        "fifo": "is a FIFO",
        "sock": "is a socket",
        "outside_link": "is a symbolic link to",
        "device": "is a character device",
    }[kind]
    assert_one_line_error(proc, str(target), want, "not a regular file")
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode)
    assert after.st_ino == before.st_ino
    if kind == "outside_link":
        assert (target.parent.parent / "victim.txt").read_text() == "keep me\n"
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


def test_symlink_inside_the_output_directory_is_followed(
    cli: Cli, toy: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "real.clb").write_bytes(b"old")
    (out / "link.clb").symlink_to("real.clb")
    cli(*_convert_args(toy, out / "link.clb"))
    assert (out / "link.clb").is_symlink()
    assert (out / "real.clb").read_bytes()[:4] != b"old"


def test_other_writers_refuse_a_fifo(cli: Cli, toy: Path, tmp_path: Path, fifo: Path) -> None:
    """generate (a directory), make-toy and export go through the same check (export's before
    it reads its source)."""
    for argv in (
        ["generate", str(toy), "--out", str(fifo)],
        ["make-toy", "--out", str(fifo)],
        ["export", str(toy.parent / "block.pt"), "--out", str(fifo)],  # before the source
    ):
        proc = cli(*argv, check=False)
        assert_one_line_error(proc, str(fifo))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_helper_refuses_a_char_device_with_mocked_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check on a (mocked) character device: refused before any temporary is made."""
    target = tmp_path / "dev"
    target.write_bytes(b"x")
    real = paths._stat_kind

    def fake(p: Path, follow: bool) -> int | None:
        if Path(p) == target:
            return stat.S_IFCHR
        return real(p, follow)

    monkeypatch.setattr(paths, "_stat_kind", fake)
    with pytest.raises(OutputError, match=r"dev: is a character device, not a regular file"):
        write_file_atomic(target, b"new")
    assert target.read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev"]
    with pytest.raises(OutputError, match="is a character device"):
        check_output_file(target)


def test_streamed_outputs_write_into_a_fifo(tmp_path: Path, fifo: Path) -> None:
    """save_npy (run / reference --output) writes into an existing FIFO, not over it."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    save_npy(fifo, np.arange(4, dtype=np.int32))
    reader.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith(b"\x93NUMPY")
    assert not (tmp_path / "pipe.npy").exists()


def test_streamed_output_into_a_device(device: Path) -> None:
    """... and into a character device (one made in tmp_path, the null device's numbers)."""
    try:
        save_npy(device, np.arange(4, dtype=np.int32))
    except OutputError as exc:  # tmp_path on a nodev mount: the device cannot be opened
        assert "cannot write" in str(exc) or "permission" in str(exc)
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert not (device.parent / "null.npy").exists()


def test_reference_output_into_a_fifo(cli: Cli, toy: Path, tmp_path: Path, fifo: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    cli("reference", str(toy), "--input", str(tmp_path / "x.npy"), "--output", str(fifo))
    reader.join(10)
    assert got and got[0].startswith(b"\x93NUMPY")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_reference_output_socket_refused(cli: Cli, toy: Path, tmp_path: Path, sock: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    proc = cli(
        "reference",
        str(toy),
        "--input",
        str(tmp_path / "x.npy"),
        "--output",
        str(sock),
        check=False,
    )
    assert_one_line_error(proc, str(sock), "is a socket")
