"""devices.yaml: schema validation with errors that name the file and key, and device selection."""

from pathlib import Path

import pytest

from harness.devices import load_devices_file
from harness.errors import ConfigError

GOOD = """
socs:
  sm8650: {name: Snapdragon 8 Gen 3, soc_model: 57, htp_arch: 75, vtcm_mb: 8, board_platform: pineapple}
  sm8550: {name: Snapdragon 8 Gen 2, soc_model: 43, htp_arch: 73, vtcm_mb: 8, board_platform: kalama}
devices:
  - {id: a, soc: sm8650, transport: emulator}
  - {id: b, soc: sm8650, transport: emulator}
  - {id: c, soc: sm8550, transport: emulator}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "devices.yaml"
    p.write_text(text)
    return p


def test_repository_devices_file_has_an_emulator_per_soc():
    devices = load_devices_file(Path(__file__).parent.parent / "devices.yaml")
    for soc in ("sm8650", "sm8550", "sm8750", "qcs6490"):
        assert any(d.soc == soc and d.transport == "emulator" for d in devices.devices)
    sm8650 = devices.soc("sm8650")
    assert (sm8650.soc_model, sm8650.htp_arch, sm8650.vtcm_bytes) == (57, 75, 8 * 1024 * 1024)


def test_select_by_id_and_by_soc_keeps_order_without_repeats(tmp_path):
    devices = load_devices_file(write(tmp_path, GOOD))
    assert [d.id for d in devices.select(["c", "sm8650", "a"])] == ["c", "a", "b"]


def test_unknown_device_lists_known_ids_and_socs(tmp_path):
    devices = load_devices_file(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match=r"unknown device 'zz'.*a, b, c.*sm8550, sm8650"):
        devices.select(["zz"])


@pytest.mark.parametrize("text, expected", [
    (GOOD.replace("vtcm_mb: 8, board_platform: pineapple", "vtcm_mb: 8, board_platform: pineapple, foo: 1"),
     r"socs\.sm8650\.foo: unknown key"),
    (GOOD.replace("soc_model: 57, ", ""), r"socs\.sm8650\.soc_model: required key is missing"),
    (GOOD.replace("{id: a, soc: sm8650, transport: emulator}", "{id: a, soc: sm9999, transport: emulator}"),
     r"soc 'sm9999' is not in socs"),
    (GOOD.replace("transport: emulator}\n  - {id: b", "transport: carrier-pigeon}\n  - {id: b"),
     r"devices\.0: .*'carrier-pigeon'.*expected tags: 'emulator', 'adb', 'ssh'"),
    (GOOD.replace("{id: b,", "{id: a,"), r"duplicate device id 'a'"),
    (GOOD + "  - [unclosed\n", r"not valid YAML at line \d+"),
], ids=["unknown-key", "missing-key", "unknown-soc", "unknown-transport", "duplicate-id", "bad-yaml"])
def test_malformed_file_names_the_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_devices_file(path)
    assert str(path) in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read devices file .*nope\.yaml"):
        load_devices_file(tmp_path / "nope.yaml")
