"""colibri.hostmem: the machine's available memory, and a checkpoint too large for it refused
before a weight is read (one line naming the bytes needed and the limit), nothing written."""

from __future__ import annotations

import json
import math
import resource
import struct
import sys
from pathlib import Path

import pytest
from colibri import hostmem
from colibri.cli.main import main
from colibri.hostmem import MemoryLimit, available_memory
from conftest import ROOT
from hf_tiny import MIXTRAL_1LAYER_CONFIG


def _fake_proc(tmp_path: Path, available_kib: int, cg_max: str, cg_current: int) -> dict:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        f"MemTotal: 24000000 kB\nMemFree: 1000 kB\nMemAvailable: {available_kib} kB\n"
    )
    root = tmp_path / "cgroup"
    leaf = root / "ci" / "job"
    leaf.mkdir(parents=True, exist_ok=True)
    (leaf / "memory.max").write_text("max\n")  # the leaf has no limit, its parent has
    (leaf / "memory.current").write_text("1\n")
    (root / "ci" / "memory.max").write_text(cg_max + "\n")
    (root / "ci" / "memory.current").write_text(f"{cg_current}\n")
    proc_cgroup = tmp_path / "self_cgroup"
    proc_cgroup.write_text("0::/ci/job\n")
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmSize:\t  100 kB\n")
    return {"meminfo": meminfo, "proc_cgroup": proc_cgroup, "cgroup_root": root, "status": status}


def test_the_tightest_limit_wins(tmp_path: Path) -> None:
    paths = _fake_proc(tmp_path, available_kib=8 << 20, cg_max=str(3 << 30), cg_current=1 << 30)
    limit = available_memory(**paths)
    assert limit == MemoryLimit(2 << 30, f"cgroup limit {paths['cgroup_root']}/ci/memory.max")
    paths = _fake_proc(tmp_path, available_kib=1 << 20, cg_max="max", cg_current=0)
    limit = available_memory(**paths)
    assert limit == MemoryLimit(1 << 30, "MemAvailable in /proc/meminfo")


def test_unreadable_sources_are_no_limit(tmp_path: Path) -> None:
    missing = tmp_path / "none"
    limit = available_memory(missing, missing, missing, missing)
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        assert limit is None
    else:
        assert limit is not None and limit.source == "the address-space limit (ulimit -v)"


def test_this_machine_has_a_limit() -> None:
    limit = available_memory()
    assert limit is not None, "Linux has /proc/meminfo"
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024  # MemTotal
    assert 0 < limit.bytes <= total


def _mixtral_header_only(where: Path, vocab: int, d: int, f: int) -> int:
    """A 1-layer Mixtral checkpoint whose data is a hole in a sparse file: the header declares
    every tensor (fp32 bytes returned), no weight is ever written to disk."""
    where.mkdir()
    p = "model.layers.0."
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (vocab, d),
        f"{p}input_layernorm.weight": (d,),
        f"{p}post_attention_layernorm.weight": (d,),
        f"{p}self_attn.q_proj.weight": (d, d),
        f"{p}self_attn.k_proj.weight": (d // 4, d),
        f"{p}self_attn.v_proj.weight": (d // 4, d),
        f"{p}self_attn.o_proj.weight": (d, d),
        f"{p}block_sparse_moe.gate.weight": (2, d),
    }
    for e in range(2):
        for name, shape in (("w1", (f, d)), ("w3", (f, d)), ("w2", (d, f))):
            shapes[f"{p}block_sparse_moe.experts.{e}.{name}.weight"] = shape
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(where / "model.safetensors", "wb") as fp:
        fp.write(struct.pack("<Q", len(raw)) + raw)
        fp.truncate(8 + len(raw) + offset)
    config = dict(
        MIXTRAL_1LAYER_CONFIG,
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=f,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    (where / "config.json").write_text(json.dumps(config))
    return offset


@pytest.mark.parametrize("command", ["generate", "convert"])
def test_too_large_for_this_machine_is_refused_before_loading(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """generate holds the whole model; convert one layer at a time, but the embedding and LM
    head (4.3 GB here) at once too, so both are refused."""
    ckpt = tmp_path / "ckpt"
    fp32 = _mixtral_header_only(ckpt, vocab=1 << 20, d=512, f=1024)  # 4.3 GB, a sparse hole
    assert fp32 == 4_310_181_888
    limit = MemoryLimit(2 << 30, "cgroup limit /sys/fs/cgroup/memory.max")
    monkeypatch.setattr(hostmem, "available_memory", lambda: limit)
    out = tmp_path / ("out" if command == "generate" else "model.clb")
    args = [command, str(ckpt), "--out", str(out)]
    args += ["--board", "host"] if command == "generate" else []
    assert main(args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    if command == "generate":
        assert err[0] == (
            f"colibri: error: {ckpt}: loading needs at least 4,310,181,888 bytes of memory (its "
            f"1,077,545,472 weights as fp32), but only 2,147,483,648 are available (cgroup limit "
            f"/sys/fs/cgroup/memory.max); run it on a machine with more memory, or free some "
            f"(quantising does not lower this: the loader holds the fp32 weights)"
        )
    else:  # every weight (one layer) and a second copy of the largest layer tensor (4 MiB)
        assert err[0] == (
            f"colibri: error: {ckpt}: converting needs at least 4,312,279,040 bytes of memory "
            f"(1,077,545,472 weights as fp32 at once: the embedding, LM head and the largest "
            f"decoder layer, read one layer at a time), but only 2,147,483,648 are available "
            f"(cgroup limit /sys/fs/cgroup/memory.max); run it on a machine with more memory, "
            f"or free some"
        )
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_convert_streams_a_model_larger_than_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint of 6 layers whose fp32 weights exceed the limit, but whose largest layer
    with the embedding / LM head fits: convert (one layer at a time) accepts it, generate (the
    whole model) refuses it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import mixtral_ckpt

    ckpt = tmp_path / "ckpt"
    config = {
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
    }
    weights = 4 * mixtral_ckpt.parameters(config)
    mixtral_ckpt.write_checkpoint(ckpt, config)
    per_layer = 4 * (2 * 64 + (64 + 32 + 32 + 64) * 64 + 4 * 64 + 4 * 3 * 64 * 256)
    streamed = weights - 5 * per_layer + 4 * 64 * 256
    limit = MemoryLimit((streamed + weights) // 2, "cgroup limit /sys/fs/cgroup/memory.max")
    assert streamed < limit.bytes < weights
    monkeypatch.setattr(hostmem, "available_memory", lambda: limit)
    out = tmp_path / "model.clb"
    assert main(["convert", str(ckpt), "--out", str(out), "-q"]) == 0
    assert out.is_file()
    capsys.readouterr()
    assert main(["generate", str(ckpt), "--out", str(tmp_path / "gen"), "--board", "host"]) != 0
    assert "loading needs at least" in capsys.readouterr().err
    assert not (tmp_path / "gen").exists()
