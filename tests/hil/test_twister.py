"""Zephyr twister and pytest-embedded descriptions (issue 39, item 3), checked without Zephyr or
ESP-IDF: examples/zephyr_app/sample.yaml and tests/zephyr/colibri_layer/testcase.yaml have the
structure and types of twister's testsuite schema (scripts/schemas/twister/
testsuite-schema.yaml, the keys used here), and their console-harness regexes match, in order,
what examples/zephyr_app/src/main.c prints when run on the host against stub Zephyr headers with
the testcase's model (generated with the make-toy arguments its CMakeLists.txt uses). The
pytest-embedded test of examples/esp_idf_app expects the same lines."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
from colibri.paths import runtime_sources
from conftest import ROOT, require_tool, run_cli, run_ok

yaml = pytest.importorskip("yaml")

SAMPLE = ROOT / "examples" / "zephyr_app" / "sample.yaml"
TESTCASE_DIR = ROOT / "tests" / "zephyr" / "colibri_layer"
TESTCASE = TESTCASE_DIR / "testcase.yaml"
ESP_TEST = ROOT / "examples" / "esp_idf_app" / "pytest_esp_idf_app.py"

#: twister's testsuite schema, the keys of `common:` and of each test (pykwalify types; ANY is
#: the schema's `type: any`, which twister 4.3 reads as a list, or as one item when a string:
#: `platform_allow: a b` is the single platform "a b", so the files here use lists).
STR, SEQ, MAP, BOOL, INT = str, list, dict, bool, int
ANY = (str, list)
SCENARIO_KEYS: dict[str, type | tuple[type, ...]] = {
    "arch_exclude": ANY, "arch_allow": ANY, "build_only": BOOL, "build_on_all": BOOL,
    "depends_on": ANY, "extra_args": ANY, "extra_configs": SEQ, "extra_conf_files": SEQ,
    "extra_overlay_confs": SEQ, "extra_dtc_overlay_files": SEQ, "extra_sections": ANY,
    "filter": STR, "integration_platforms": SEQ, "ignore_faults": BOOL,
    "ignore_qemu_crash": BOOL, "levels": SEQ, "testcases": SEQ, "harness": STR,
    "harness_config": MAP, "min_ram": INT, "min_flash": INT, "modules": SEQ,
    "platform_exclude": ANY, "platform_allow": ANY, "platform_type": SEQ, "platform_key": SEQ,
    "tags": ANY, "timeout": INT, "toolchain_exclude": ANY, "toolchain_allow": ANY, "type": STR,
    "skip": BOOL, "slow": BOOL, "sysbuild": BOOL,
}  # fmt: skip
HARNESS_KEYS: dict[str, type] = {
    "type": STR, "fixture": STR, "ordered": BOOL, "repeat": INT, "pytest_root": STR,
    "pytest_args": SEQ, "regex": SEQ, "record": MAP,
}  # fmt: skip
TEST_NAME = re.compile(r"^[a-zA-Z0-9_.]+$")


def _check_scenario(where: str, data: dict) -> None:
    for key, value in data.items():
        assert key in SCENARIO_KEYS, f"{where}: {key!r} is not a twister key"
        assert isinstance(value, SCENARIO_KEYS[key]), f"{where}.{key}: {type(value).__name__}"
    if "harness_config" in data:
        for key, value in data["harness_config"].items():
            assert key in HARNESS_KEYS, f"{where}.harness_config: unknown {key!r}"
            assert isinstance(value, HARNESS_KEYS[key]), f"{where}.harness_config.{key}"
        assert all(isinstance(r, str) for r in data["harness_config"].get("regex", []))


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and set(data) <= {"sample", "common", "tests"}, path
    assert isinstance(data.get("tests"), dict) and data["tests"], f"{path}: tests: is required"
    if "sample" in data:
        assert isinstance(data["sample"].get("name"), str), "sample: name is required"
        assert set(data["sample"]) <= {"name", "description"}
    _check_scenario(f"{path.name}:common", data.get("common", {}))
    for name, test in data["tests"].items():
        assert TEST_NAME.match(name), name
        _check_scenario(f"{path.name}:{name}", test or {})
    return data


def _regexes(data: dict) -> list[str]:
    merged = {**data.get("common", {})}
    for test in data["tests"].values():
        merged.update(test or {})
    assert merged["harness"] == "console"
    config = merged["harness_config"]
    assert config["type"] == "multi_line" and config["ordered"] is True
    return list(config["regex"])


def _ordered_match(regexes: list[str], text: str) -> None:
    """twister's multi_line console harness, ordered: each regex on a later line."""
    pending = list(regexes)
    for line in text.splitlines():
        if pending and re.search(pending[0], line):
            pending.pop(0)
    assert not pending, f"not matched in order: {pending[0]!r}\n{text}"


@pytest.mark.parametrize("path", [SAMPLE, TESTCASE], ids=["sample", "testcase"])
def test_twister_files_follow_the_schema(path: Path) -> None:
    data = _load(path)
    for regex in _regexes(data):
        re.compile(regex)
    for test in data["tests"].values():
        # a string would be one platform name for twister 4.3 ("unrecognized platform")
        assert isinstance(test["platform_allow"], list)
        assert {"qemu_cortex_m3", "mps2/an386"} <= set(test["platform_allow"])
    assert isinstance(data["common"]["tags"], list)
    assert data["common"]["integration_platforms"] == ["qemu_cortex_m3"]


def _toy_args() -> list[str]:
    """The make-toy arguments of the testcase's CMakeLists.txt."""
    text = (TESTCASE_DIR / "CMakeLists.txt").read_text()
    match = re.search(r"make-toy --out \S+\s+(--experts.*?)\s+RESULT_VARIABLE", text, re.DOTALL)
    assert match, "CMakeLists.txt runs colibri make-toy"
    return shlex.split(match.group(1))


@pytest.fixture(scope="module")
def host_console(tmp_path_factory: pytest.TempPathFactory) -> str:
    """examples/zephyr_app/src/main.c on the host (stub Zephyr) with the testcase's model."""
    cc = require_tool("gcc", "gcc")
    work = tmp_path_factory.mktemp("twister")
    run_cli("make-toy", "--out", str(work / "toy"), *_toy_args())
    model = work / "moe_layer"  # the model name the testcase's regexes expect
    run_cli("generate", str(work / "toy" / "model.bin"), "--board", "host", "--out", str(model))
    stubs = ROOT / "tests" / "stubs" / "zephyr"
    exe = work / "app"
    run_ok(
        [cc, "-std=c11", "-O2", "-ffp-contract=off", "-DCOLIBRI_NO_FILESYSTEM", f"-I{stubs}",
         f"-I{ROOT / 'runtime_c' / 'include'}", f"-I{ROOT / 'runtime_c' / 'tiles'}",
         f"-I{model}", f"-Wa,-I{model}",
         str(ROOT / "examples" / "zephyr_app" / "src" / "main.c"), str(stubs / "zephyr_host.c"),
         *map(str, sorted(model.glob("*.c"))),
         *map(str, runtime_sources()), "-lm", "-o", str(exe)]
    )  # fmt: skip
    return run_ok([str(exe)], timeout=60).stdout


def test_testcase_regexes_match_the_app(host_console: str) -> None:
    _ordered_match(_regexes(_load(TESTCASE)), host_console)


def test_sample_regexes_match_the_app(host_console: str) -> None:
    _ordered_match(_regexes(_load(SAMPLE)), host_console)


def test_testcase_regexes_fail_on_other_routing(host_console: str) -> None:
    """The harness checks the routing: other experts for token 0 do not pass."""
    wrong = re.sub(r"experts\[0\]: (\d+) (\d+)", r"experts[0]: \2 \1", host_console)
    with pytest.raises(AssertionError, match="not matched"):
        _ordered_match(_regexes(_load(TESTCASE)), wrong)


def test_pytest_embedded_example(host_console: str) -> None:
    """pytest_esp_idf_app.py: ESP-IDF example-test style (markers, a `dut` argument,
    dut.expect), and its patterns match the lines main.c prints (the Zephyr app's printk lines
    are the ESP-IDF app's printf / ESP_LOGI lines but for the counters line)."""
    tree = ast.parse(ESP_TEST.read_text())
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    markers = {ast.unparse(d).split("(")[0] for t in tests for d in t.decorator_list}
    assert {"pytest.mark.esp32s3", "pytest.mark.generic", "pytest.mark.qemu"} <= markers
    assert tests and all(t.args.args[0].arg == "dut" for t in tests)
    expects = [
        c for c in ast.walk(tree)
        if isinstance(c, ast.Call) and ast.unparse(c.func).startswith("dut.expect")
    ]  # fmt: skip
    patterns = []
    for call in expects:
        arg = call.args[0]
        if isinstance(arg, ast.JoinedStr):  # rf"experts\[{t}\]..." for t = 0
            arg = ast.Constant("".join(
                v.value if isinstance(v, ast.Constant) else "0" for v in arg.values
            ))  # fmt: skip
        assert isinstance(arg, ast.Constant), ast.unparse(call)
        patterns.append((ast.unparse(call.func), arg.value))
    assert len(patterns) >= 5
    for func, pattern in patterns:
        if "loads" in pattern:
            continue  # "forward N us" on ESP-IDF, "N cycles" on Zephyr
        found = pattern in host_console if func == "dut.expect_exact" else re.search(
            pattern, host_console
        )  # fmt: skip
        assert found, pattern
