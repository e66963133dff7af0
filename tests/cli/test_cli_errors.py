"""Nothing crashes, nothing is silently wrong (issue 14): bad command lines and unwritable
outputs are one `colibri: error:` line with a non-zero exit and nothing written.

Numeric options are range-checked when parsed; outputs under a file, on a read-only or full file
system, or that are directories are refused naming the path, and a previous output survives;
outputs get the normal modes (0777 / 0666 & ~umask); a closed stdout ends the CLI quietly;
`colibri verify` checks model files. The full-disk cases run for real on a 64 KiB tmpfs (root
only, as in CI).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess

import numpy as np
import pytest
from colibri.boards import load_board
from colibri.cli.main import build_parser, main
from colibri.emit.container import write_container
from colibri.errors import BudgetExceeded, OutputError
from colibri.frontends.hf import write_safetensors
from colibri.frontends.load import save_npy
from colibri.frontends.seed import make_toy, write_seed
from colibri.plan.budget import MAX_ARENA_BYTES, check_budget, check_transformer_budget
from hf_tiny import MIXTRAL_1LAYER_CONFIG, mixtral_tensors_1layer

Cli = Callable[..., CompletedProcess[str]]


def assert_one_line_error(proc: CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode not in (0, None), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("colibri: error: "), proc.stderr
    assert proc.stderr.count("colibri: error:") == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def snapshot(path: Path) -> dict[str, str]:
    """SHA-256 of every file under path (or of path itself)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {
        str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    write_seed(make_toy(), tmp_path / "toy")
    return tmp_path / "toy" / "model.bin"


# -- numeric options: a range checked at parse time ---------------------------------------------

BAD_OPTIONS = [
    ("generate M --out O", "--max-tokens", "0"),
    ("generate M --out O", "--max-tokens", "-1"),
    ("generate M --out O", "--max-tokens", "2147483648"),
    ("generate M --out O", "--max-tokens", "2^31"),
    ("generate M --out O", "--max-tokens", "1048577"),
    ("generate M --out O", "--cache-slots", "0"),
    ("generate M --out O", "--cache-slots", "257"),
    ("generate M --out O", "--ram-budget", "-1"),
    ("generate M --out O", "--ram-budget", "4294967296"),
    ("generate M --out O", "--max-context", "0"),
    ("generate M --out O", "--max-context", "1048577"),
    ("generate M --out O", "--layer", "-1"),
    ("convert M --out O", "--layer", "65536"),
    ("reference M --input X --output Y", "--layer", "-3"),
    ("make-toy --out O", "--experts", "0"),
    ("make-toy --out O", "--experts", "1025"),
    ("make-toy --out O", "--hidden", "0"),
    ("make-toy --out O", "--ff", "65537"),
    ("make-toy --out O", "--top-k", "0"),
    ("make-toy --out O", "--top-k", "65"),
    ("make-toy --out O", "--seed", "-1"),
    ("run D", "--timeout", "0"),
    ("run D", "--timeout", "-5"),
    ("run D", "--timeout", "nan"),
    ("run D", "--timeout", "inf"),
    ("run D", "--max-new-tokens", "-1"),
    ("run D", "--temperature", "-0.5"),
    ("run D", "--temperature", "nan"),
    ("run D", "--top-k", "-1"),
    ("run D", "--top-p", "0"),
    ("run D", "--top-p", "1.5"),
    ("run D", "--seed", "18446744073709551616"),
    ("export S --out O", "--check-tokens", "0"),
    ("export S --out O", "--seed", "-1"),
]


@pytest.mark.parametrize(("command", "option", "value"), BAD_OPTIONS)
def test_numeric_options_are_range_checked(
    command: str, option: str, value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [w.replace("O", str(tmp_path / "out")) for w in command.split()]
    with pytest.raises(SystemExit) as exc:
        main([*argv, f"{option}={value}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"colibri: error: argument {option}: "), err
    assert err.count("\n") == 1 and value in err and "allowed" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        ("generate M --out O --max-tokens 1048576", "max_tokens", 1 << 20),
        ("generate M --out O --max-tokens 1", "max_tokens", 1),
        ("generate M --out O --cache-slots 256", "cache_slots", 256),
        ("generate M --out O --ram-budget 0", "ram_budget", 0),
        ("run D --top-p 1", "top_p", 1.0),
        ("run D --max-new-tokens 0", "max_new_tokens", 0),
        ("run D --seed 18446744073709551615", "seed", 2**64 - 1),
        ("make-toy --out O --top-k 64 --experts 64", "top_k", 64),
    ],
)
def test_range_limits_are_accepted(argv: str, dest: str, value: object) -> None:
    assert getattr(build_parser().parse_args(argv.split()), dest) == value


def test_cli_errors_are_one_line(cli: Cli, toy: Path, tmp_path: Path) -> None:
    proc = cli(
        "generate", str(toy), "--out", str(tmp_path / "g"), "--max-tokens", "-1", check=False
    )
    assert proc.returncode == 2
    assert_one_line_error(proc, "--max-tokens", "-1", "1..1048576")
    assert not (tmp_path / "g").exists()
    proc = cli("make-toy", "--bogus", check=False)
    assert_one_line_error(proc)


def test_a_huge_toy_is_refused(cli: Cli, tmp_path: Path) -> None:
    proc = cli(
        "make-toy", "--out", str(tmp_path / "t"), "--experts", "1024", "--hidden", "65536",
        "--ff", "65536", check=False,
    )  # fmt: skip
    assert_one_line_error(proc, "1 GiB")
    assert not (tmp_path / "t").exists()


def test_a_chunk_over_the_mcu_ram_is_refused(cli: Cli, toy: Path, tmp_path: Path) -> None:
    proc = cli(
        "generate", str(toy), "--board", "cortex-m4", "--out", str(tmp_path / "g"),
        "--max-tokens", "1048576", check=False,
    )  # fmt: skip
    assert_one_line_error(proc, "RAM:", "--max-tokens")
    assert "--quant" not in proc.stderr  # the flash is not the problem
    assert not (tmp_path / "g").exists()


def test_an_arena_over_2_gib_is_refused_on_any_board() -> None:
    manifest = {"memory": {"weight_bytes": 100, "arena_size": MAX_ARENA_BYTES + 1, "max_tokens": 7}}
    for board in ("host", "cortex-m4"):
        with pytest.raises(BudgetExceeded, match=r"2 GiB.*--max-tokens \(now 7\)"):
            check_budget(manifest, load_board(board))


def _manifest(weights: int, arena: int) -> dict[str, object]:
    regions = [{"name": "kv_cache", "offset": 0, "size": arena, "what": "KV cache"}]
    return {
        "memory": {
            "weight_bytes": weights,
            "arena_size": arena,
            "max_tokens": 1,
            "max_context": 64,
            "kv_cache_bytes": arena,
            "regions": regions,
        },
        "quantization": {"scheme": "int8"},  # no --quant hint (it needs the model)
    }


def test_budget_advice_matches_the_region_that_overflowed() -> None:
    board = load_board("cortex-m4")
    flash = board.memory["flash"].size
    with pytest.raises(BudgetExceeded) as exc:
        check_budget(_manifest(flash, 1024), board)
    msg = str(exc.value)
    assert "flash:" in msg and "--quant" in msg and "RAM:" not in msg
    assert "--max-tokens" not in msg
    with pytest.raises(BudgetExceeded) as exc:  # a whole transformer: no --max-context advice
        check_transformer_budget(None, _manifest(flash, 1024), board)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert "flash:" in msg and "max-context" not in msg and "KV cache" not in msg, msg
    with pytest.raises(BudgetExceeded) as exc:
        check_transformer_budget(None, _manifest(1024, 1 << 30), board)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert "RAM:" in msg and "--max-context" in msg and "--quant" not in msg, msg


# -- output paths -------------------------------------------------------------------------------


def test_convert_out_an_existing_directory(cli: Cli, toy: Path, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    proc = cli("convert", str(toy), "--out", str(tmp_path / "d"), check=False)
    assert_one_line_error(proc, "is a directory", "file path")
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "{toy}", "--out", "{f}/gen"],
        ["convert", "{toy}", "--out", "{f}/sub/m.clb"],
        ["make-toy", "--out", "{f}/toy"],
        ["make-toy", "--out", "{f}"],
        ["reference", "{toy}", "--input", "{x}", "--output", "{f}/y.npy"],
        ["reference", "{toy}", "--input", "{x}", "--output", "{y}", "--routing", "{f}/r.npz"],
    ],
)
def test_outputs_under_a_file(cli: Cli, toy: Path, tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "file").write_text("not a directory")
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    names = {"toy": toy, "f": tmp_path / "file", "x": tmp_path / "x.npy", "y": tmp_path / "y.npy"}
    proc = cli(*[a.format(**names) for a in argv], check=False)
    assert_one_line_error(proc, str(tmp_path / "file"))
    assert (tmp_path / "file").read_text() == "not a directory"
    assert not (tmp_path / "y.npy").exists()


def test_run_output_under_a_file_is_refused_before_building(
    cli: Cli, toy: Path, tmp_path: Path
) -> None:
    cli("generate", str(toy), "--out", str(tmp_path / "gen"))
    (tmp_path / "file").write_text("")
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    proc = cli(
        "run", str(tmp_path / "gen"), "--input", str(tmp_path / "x.npy"),
        "--output", str(tmp_path / "file" / "y.npy"), check=False,
    )  # fmt: skip
    assert_one_line_error(proc, "is a file, not a directory")
    assert not (tmp_path / "gen" / "build").exists()


def _deny(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make creating any temporary output fail as a directory without write permission does
    (root ignores permission bits, so the failure is injected where the output is created)."""
    import tempfile

    def denied(*args: object, **kwargs: object) -> str:
        raise PermissionError(errno.EACCES, "Permission denied", str(kwargs.get("dir")))

    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    monkeypatch.setattr(tempfile, "mkstemp", denied)


@pytest.mark.parametrize("command", ["generate", "convert", "make-toy", "reference"])
def test_unwritable_output_directory(
    command: str,
    toy: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    out = tmp_path / "ro" / "out"
    argv = {
        "generate": ["generate", str(toy), "--out", str(out)],
        "convert": ["convert", str(toy), "--out", str(out)],
        "make-toy": ["make-toy", "--out", str(out)],
        "reference": ["reference", str(toy), "--input", str(tmp_path / "x.npy"), "--output",
                      str(out)],
    }[command]  # fmt: skip
    _deny(monkeypatch)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("colibri: error: ") and err.count("\n") == 1, err
    assert "permission denied" in err and str(tmp_path / "ro") in err, err
    assert not out.exists()


# -- real file systems: read-only and full (tmpfs, root only) -----------------------------------


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """mount_tmpfs(name, "size=64k") -> a fresh tmpfs under tmp_path, unmounted afterwards;
    skips when mounting is not permitted (CI runs as root, where it is)."""
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {proc.stderr.strip()}")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in reversed(mounted):
            subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path) -> None:
    """Use up every free byte of the file system fs."""
    with open(fs / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_read_only_file_system(
    cli: Cli, toy: Path, tmp_path: Path, mount_tmpfs: Callable[..., Path]
) -> None:
    ro = mount_tmpfs("ro", "ro,size=64k")
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    for argv in (
        ["generate", str(toy), "--out", str(ro / "g")],
        ["convert", str(toy), "--out", str(ro / "m.clb")],
        ["make-toy", "--out", str(ro / "t")],
        ["reference", str(toy), "--input", str(tmp_path / "x.npy"), "--output", str(ro / "y")],
    ):
        proc = cli(*argv, check=False)
        assert_one_line_error(proc, str(ro), "read-only file system")
    assert list(ro.iterdir()) == []


def test_disk_full_keeps_the_previous_output(
    cli: Cli, toy: Path, tmp_path: Path, mount_tmpfs: Callable[..., Path]
) -> None:
    fs = mount_tmpfs("full", "size=64k")
    cli("generate", str(toy), "--out", str(fs / "gen"))
    cli("convert", str(toy), "--out", str(fs / "m.clb"))
    np.save(tmp_path / "x.npy", np.ones((3, 8), np.float32))
    cli("reference", str(toy), "--input", str(tmp_path / "x.npy"), "--output", str(fs / "y.npy"))
    before = {**snapshot(fs / "gen"), **snapshot(fs / "m.clb"), **snapshot(fs / "y.npy")}
    fill(fs)
    other = make_toy(experts=3, hidden=8, ff=16, seed=4)  # different content: a real rewrite
    write_seed(other, tmp_path / "other")
    model = str(tmp_path / "other" / "model.bin")
    for argv, target in (
        (["generate", model, "--out", str(fs / "gen")], fs / "gen"),
        (["convert", model, "--out", str(fs / "m.clb")], fs / "m.clb"),
        (["reference", model, "--input", str(tmp_path / "x.npy"), "--output", str(fs / "y.npy")],
         fs / "y.npy"),
    ):  # fmt: skip
        proc = cli(*argv, check=False)
        assert_one_line_error(proc, str(target), "no space left on device", "bytes needed")
    after = {**snapshot(fs / "gen"), **snapshot(fs / "m.clb"), **snapshot(fs / "y.npy")}
    assert after == before
    assert sorted(p.name for p in fs.iterdir()) == ["filler", "gen", "m.clb", "y.npy"]


def test_disk_full_whole_model_convert_names_the_bytes(
    cli: Cli, tmp_path: Path, mount_tmpfs: Callable[..., Path]
) -> None:
    """The whole-model convert writes layer by layer (its size unknown until the end): its
    full-disk error is the same line as every output's, with the bytes needed (issue 37)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(MIXTRAL_1LAYER_CONFIG))
    write_safetensors(mixtral_tensors_1layer(), ckpt / "model.safetensors")
    fs = mount_tmpfs("full", "size=64k")
    fill(fs)
    proc = cli("convert", str(ckpt), "--out", str(fs / "lm.clb"), check=False)
    assert_one_line_error(
        proc, f"{fs / 'lm.clb'}: no space left on device (about ", " bytes needed)"
    )
    assert sorted(p.name for p in fs.iterdir()) == ["filler"]


def test_disk_full_in_process_writers(mount_tmpfs: Callable[..., Path]) -> None:
    """The writers behind `export` (write_container) and `run --output` (save_npy)."""
    fs = mount_tmpfs("full", "size=64k")
    layer = make_toy()
    write_container(layer, fs / "b.clb")
    save_npy(fs / "ids.npy", np.arange(5, dtype=np.int32))
    before = {**snapshot(fs / "b.clb"), **snapshot(fs / "ids.npy")}
    fill(fs)
    with pytest.raises(OutputError, match=r"b\.clb: no space left on device \(\d+ bytes needed"):
        write_container(make_toy(seed=3), fs / "b.clb")
    with pytest.raises(OutputError, match=r"ids\.npy: no space left on device"):
        save_npy(fs / "ids.npy", np.arange(50000, dtype=np.int32))
    assert {**snapshot(fs / "b.clb"), **snapshot(fs / "ids.npy")} == before
    assert sorted(p.name for p in fs.iterdir()) == ["b.clb", "filler", "ids.npy"]


# -- file modes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_get_normal_modes(toy: Path, tmp_path: Path, umask: int) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    out = tmp_path / "out"
    commands = [
        ["generate", str(toy), "--out", str(out / "gen")],
        ["convert", str(toy), "--out", str(out / "m.clb")],
        ["make-toy", "--out", str(out / "toy")],
        ["make-toy", "--out", str(out / "gated"), "--activation", "swiglu"],
        ["reference", str(toy), "--input", str(tmp_path / "x.npy"), "--output", str(out / "y.npy")],
    ]
    for argv in commands:
        proc = subprocess.run(
            [sys.executable, "-m", "colibri", *argv],
            capture_output=True,
            text=True,
            preexec_fn=lambda: os.umask(umask),
        )
        assert proc.returncode == 0, proc.stderr
    for p in [out / "gen", out / "toy", out / "gated", *out.rglob("*")]:
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert p.stat().st_mode & 0o777 == want, f"{p}: {oct(p.stat().st_mode & 0o777)}"


# -- a closed stdout ----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["size", "/bin/true", "--board", "host"], ["boards", "--json"]])
def test_closed_stdout_exits_quietly(argv: list[str]) -> None:
    """`colibri size ... | head`: the reader is gone; exit 141 (SIGPIPE) with no traceback."""
    if not Path("/bin/true").is_file():
        pytest.skip("no /bin/true ELF to size")
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "colibri", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


# -- Hugging Face config without "architectures" --------------------------------------------------


def test_hf_config_without_architectures(cli: Cli, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = {"hidden_size": 8, "num_local_experts": 2, "num_experts_per_tok": 1}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    write_safetensors({"model.norm.weight": np.ones(8, np.float32)}, ckpt / "model.safetensors")
    for argv in (
        ["generate", str(ckpt), "--out", str(tmp_path / "g"), "--max-context", "16"],
        ["generate", str(ckpt), "--out", str(tmp_path / "g")],
        ["convert", str(ckpt), "--out", str(tmp_path / "m.clb"), "--layer", "0"],
        ["verify", str(ckpt)],
    ):
        proc = cli(*argv, check=False)
        assert_one_line_error(proc, '"architectures"', "MixtralForCausalLM", "OlmoeForCausalLM")
        assert "--max-context" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# -- colibri verify --------------------------------------------------------------------------------


def test_verify_good_files(cli: Cli, toy: Path, tmp_path: Path) -> None:
    layer = make_toy(experts=3, hidden=4, ff=8, top_k=2, activation="swiglu")
    write_container(layer, tmp_path / "m.clb")
    np.savez(
        tmp_path / "m.npz",
        router_weight=layer.router_w,
        w1=np.stack([e.w1 for e in layer.experts]),
        w2=np.stack([e.w2 for e in layer.experts]),
        w3=np.stack([e.w3 for e in layer.experts if e.w3 is not None]),
        config=np.array(json.dumps(layer.config.to_json())),
    )
    cases = [
        (toy, "seed layout"),
        (tmp_path / "m.clb", "CRC-32"),
        (tmp_path / "m.npz", "numpy .npz"),
        (toy.parent, "directory"),
    ]
    for path, what in cases:
        proc = cli("verify", str(path))
        assert what in proc.stdout and "NaN" in proc.stdout, proc.stdout
        assert proc.stdout.splitlines()[-1] == "ok"


def test_verify_reports_the_first_problem(cli: Cli, toy: Path, tmp_path: Path) -> None:
    path = write_container(make_toy(), tmp_path / "m.clb")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # a weight of the last tensor
    path.write_bytes(bytes(data))
    proc = cli("verify", str(path), check=False)
    assert_one_line_error(proc, "CRC-32")
    assert proc.returncode == 1 and "Colibri container" in proc.stdout and "ok" not in proc.stdout
    w = np.fromfile(toy, dtype="<f4")
    w[5] = np.nan
    w.tofile(toy)
    proc = cli("verify", str(toy), check=False)
    assert_one_line_error(proc, "NaN")
    proc = cli("verify", str(tmp_path / "nothing"), check=False)
    assert_one_line_error(proc, "no such file")


def test_verify_hf_checkpoint(cli: Cli, tmp_path: Path) -> None:
    p = "model.layers.0."
    tensors = mixtral_tensors_1layer()
    config = dict(MIXTRAL_1LAYER_CONFIG)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(config))
    write_safetensors(tensors, ckpt / "model.safetensors")
    proc = cli("verify", str(ckpt))
    assert "MixtralForCausalLM" in proc.stdout and proc.stdout.splitlines()[-1] == "ok"
    tensors[f"{p}self_attn.o_proj.weight"][1, 2] = np.inf
    write_safetensors(tensors, ckpt / "model.safetensors")
    proc = cli("verify", str(ckpt), check=False)
    assert_one_line_error(proc, "o_proj.weight", "NaN/Inf")


def test_generate_name_is_limited(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--name: a C name of at most MAX_NAME characters (every generated file stays clang-format
    clean up to it, tests/emit/test_generated_format.py); longer is one line naming the limit,
    as is an output directory's name used as the default."""
    from colibri.cli import pipeline
    from colibri.emit.cformat import MAX_NAME
    from colibri.errors import ConfigError
    from colibri.options import GenerateOptions

    ok = "n" * MAX_NAME
    assert build_parser().parse_args(["generate", "M", "--out", "O", "--name", ok]).name == ok
    long = "n" * (MAX_NAME + 1)
    with pytest.raises(SystemExit) as exc:
        main(["generate", "M", "--out", str(tmp_path / "out"), "--name", long])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("colibri: error: argument --name: "), err
    assert err.count("\n") == 1 and f"at most {MAX_NAME}" in err and long in err, err
    assert not (tmp_path / "out").exists()
    toy = make_toy(4, 8, 16, 2, "relu", seed=0)
    with pytest.raises(ConfigError, match=f"{MAX_NAME + 1} characters long; allowed: at most"):
        pipeline.render(toy, GenerateOptions(name=long))
