"""Command-line inputs are read exactly (issue 37): `--prompt-ids 1,,2` is not `1,2`, and
config.json fields are range-checked wherever a Hugging Face config is read."""

from __future__ import annotations

import pytest
from colibri.errors import InputError
from colibri.targets.lmrun import parse_ids


@pytest.mark.parametrize(
    ("text", "want"),
    [("1,5,9", [1, 5, 9]), ("1, 5, 9", [1, 5, 9]), (" 7 ", [7]), ("1 5 9", [1, 5, 9])],
)
def test_prompt_ids_good(text: str, want: list[int]) -> None:
    assert parse_ids(text) == want


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("1,,2", "item 2 is empty"),
        ("1,2,", "item 3 is empty"),
        (",1", "item 1 is empty"),
        ("1, ,2", "item 2 is empty"),
        ("1,x", "item 2 is 'x'"),
        ("1,2.5", "item 2 is '2.5'"),
        ("1_0", "item 1 is '1_0'"),
        ("0x10", "item 1 is '0x10'"),
        ("1 2,3", "item 1 is '1 2'"),
        ("", "--prompt-ids is empty"),
        ("  ", "--prompt-ids is empty"),
        ("١٢", "item 1 is"),
    ],
)
def test_prompt_ids_bad(text: str, msg: str) -> None:
    with pytest.raises(InputError, match=msg):
        parse_ids(text)
