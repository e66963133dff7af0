"""pytest-embedded test of the Colibri ESP-IDF example, in the style of ESP-IDF's own example
tests (examples/**/pytest_*.py): the `dut` fixture flashes the app built in ./build and reads
its console; the test expects what main/main.c prints (the model line, the experts, gates and
outputs of both demo tokens, the loader counters, "colibri: done").

On a board (pytest-embedded's idf + esp services):

    pip install pytest-embedded pytest-embedded-serial-esp pytest-embedded-idf
    idf.py set-target esp32s3 build
    pytest --target esp32s3 --embedded-services esp,idf --port /dev/ttyUSB0 pytest_esp_idf_app.py

Under Espressif's QEMU (idf.py --preview qemu / `idf_tools.py install qemu-xtensa`):

    pip install pytest-embedded-idf pytest-embedded-qemu
    pytest --target esp32s3 --embedded-services idf,qemu -m qemu pytest_esp_idf_app.py
"""

from __future__ import annotations

import re

import pytest

TOKENS = 2  # main.c's DEMO_TOKENS


def _floats(match: re.Match) -> list[float]:
    return [float(v) for v in match.group(1).split()]


def check_colibri_output(dut) -> None:  # noqa: ANN001 - pytest_embedded's Dut
    model = dut.expect(
        r"colibri: model (\w+), (\d+) experts, top-(\d+), d_model (\d+), (\d+) tokens", timeout=60
    )
    experts, top_k, d_model = (int(model.group(i)) for i in (2, 3, 4))
    for t in range(TOKENS):
        ids = dut.expect(rf"experts\[{t}\]:((?: \d+)+)", timeout=10)
        chosen = [int(v) for v in ids.group(1).split()]
        assert len(chosen) == top_k and len(set(chosen)) == top_k
        assert all(0 <= e < experts for e in chosen)
        gates = _floats(dut.expect(rf"gates\[{t}\]:((?: -?\d+\.\d+)+)", timeout=10))
        assert len(gates) == top_k and all(0.0 < g <= 1.0 for g in gates)
        out = _floats(dut.expect(rf"output\[{t}\]:((?: -?\d+\.\d+)+)", timeout=10))
        assert len(out) == d_model
    dut.expect(r"colibri: \d+ loads, \d+ hits, \d+ misses, \d+ evictions, forward \d+ us")
    dut.expect_exact("colibri: done", timeout=10)


@pytest.mark.esp32s3
@pytest.mark.generic
def test_colibri_moe_layer(dut) -> None:  # noqa: ANN001
    check_colibri_output(dut)


@pytest.mark.esp32s3
@pytest.mark.qemu
@pytest.mark.parametrize("embedded_services", ["idf,qemu"], indirect=True)
def test_colibri_moe_layer_qemu(dut) -> None:  # noqa: ANN001
    check_colibri_output(dut)
