"""devices.yaml: schema validation with errors that name the file and key, device selection, and the
SoC catalog that ships with the package (harness/socs.yaml) merged with a file's `socs:`."""

from importlib import resources
from pathlib import Path

import pytest
import yaml

from harness.devices import builtin_devices, load_catalog, load_devices_file
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


REPO_DEVICES = Path(__file__).parent.parent / "devices.yaml"


def test_repository_devices_file_has_an_emulator_per_soc():
    devices = load_devices_file(REPO_DEVICES)
    for soc in ("sm8650", "sm8550", "sm8750", "qcs6490"):
        assert any(d.soc == soc and d.transport == "emulator" for d in devices.devices)
    sm8650 = devices.soc("sm8650")
    assert (sm8650.soc_model, sm8650.htp_arch, sm8650.vtcm_bytes) == (57, 75, 8 * 1024 * 1024)
    assert "socs" not in yaml.safe_load(REPO_DEVICES.read_text())  # the catalog ships with the package


def test_catalog_ships_with_the_package_and_builtin_emulators_need_no_file(monkeypatch):
    assert resources.files("harness").joinpath("socs.yaml").is_file()
    monkeypatch.delenv("HARNESS_DEVICES_FILE", raising=False)
    devices = load_devices_file()
    assert devices.path == "built-in emulator devices"
    assert [(d.id, d.soc, d.transport) for d in devices.devices] == [
        (f"{soc}-emu", soc, "emulator") for soc in ("sm8450", "sm8550", "sm8650", "sm8750", "qcs6490", "sa8295p")]
    # the repository's devices.yaml lists the same devices over the same catalog
    repo = load_devices_file(REPO_DEVICES)
    assert repo.devices == devices.devices and repo.socs == devices.socs == builtin_devices().socs
    assert load_catalog().soc("qcs6490").htp_arch == 68
    with pytest.raises(ConfigError, match=r"unknown device 'rb3' in built-in emulator devices: .*"
                                          r"\(no devices file: pass --devices-file"):
        devices.select(["rb3"])


def test_a_file_with_only_devices_uses_the_builtin_catalog(tmp_path):
    devices = load_devices_file(write(tmp_path, "devices:\n  - {id: lab-8g3, soc: sm8650, transport: emulator}\n"
                                                "  - {id: rb3, soc: qcs6490, transport: emulator}\n"))
    assert [d.id for d in devices.select(["sm8650", "rb3"])] == ["lab-8g3", "rb3"]
    assert devices.soc("qcs6490").vtcm_mb == 2 and devices.soc("sm8650").name == "Snapdragon 8 Gen 3"
    with pytest.raises(ConfigError, match=r"unknown device 'sm8750'.*'sm8750' is a catalog SoC, but no device"):
        devices.select(["sm8750"])


def test_socs_entries_override_single_fields_and_add_socs(tmp_path):
    builtin = builtin_devices().soc("sm8650")
    devices = load_devices_file(write(tmp_path, """
socs:
  sm8650: {vtcm_mb: 4, thermal: {load_power_w: 7.5}}
  sm8475: {name: Snapdragon 8+ Gen 1, soc_model: 42, htp_arch: 69, vtcm_mb: 8, board_platform: taro}
devices:
  - {id: a, soc: sm8650, transport: emulator}
  - {id: b, soc: sm8475, transport: emulator}
"""))
    sm8650 = devices.soc("sm8650")
    assert sm8650.vtcm_mb == 4 and sm8650.thermal.load_power_w == 7.5
    assert sm8650.model_copy(update={"vtcm_mb": builtin.vtcm_mb, "thermal": builtin.thermal}) == builtin
    assert devices.soc("sm8475").board_platform == "taro"
    assert devices.soc("sm8550") == builtin_devices().soc("sm8550")


def test_a_file_without_devices_gets_the_emulators_of_its_catalog(tmp_path):
    devices = load_devices_file(write(tmp_path, """
socs:
  sm8650: {vtcm_mb: 4}
  sm8475: {name: Snapdragon 8+ Gen 1, soc_model: 42, htp_arch: 69, vtcm_mb: 8, board_platform: taro}
"""))
    assert [d.id for d in devices.select(["sm8650", "sm8475"])] == ["sm8650-emu", "sm8475-emu"]
    assert devices.soc("sm8650").vtcm_mb == 4


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
    (GOOD.replace("sm8550: {name: Snapdragon 8 Gen 2, soc_model: 43,", "sm9000: {name: Future,"),
     r"socs\.sm9000\.soc_model: required key is missing"),
    (GOOD.replace("{id: a, soc: sm8650, transport: emulator}", "{id: a, soc: sm9999, transport: emulator}"),
     r"devices\[0\] \(a\): unknown SoC 'sm9999': not in the built-in catalog nor in this file's socs: "
     r"\(known SoCs: qcs6490, sa8295p, sm8450, sm8550, sm8650, sm8750;"),
    ("socs: {sm8650: 4}\ndevices: []\n", r"socs\.sm8650: Input should be a valid dictionary"),
    ("socs: [sm8650]\ndevices: []\n", r"socs: expected a mapping of SoC id to fields, got list"),
    ("- a\n", r"expected a mapping with keys 'devices' and \(optional\) 'socs', got list"),
    (GOOD.replace("transport: emulator}\n  - {id: b", "transport: carrier-pigeon}\n  - {id: b"),
     r"devices\.0: .*'carrier-pigeon'.*expected tags: 'emulator', 'adb', 'ssh'"),
    (GOOD.replace("{id: b,", "{id: a,"), r"duplicate device id 'a'"),
    (GOOD + "  - [unclosed\n", r"not valid YAML at line \d+"),
], ids=["unknown-key", "missing-key", "unknown-soc", "soc-not-mapping", "socs-not-mapping", "not-mapping",
        "unknown-transport", "duplicate-id", "bad-yaml"])
def test_malformed_file_names_the_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_devices_file(path)
    assert str(path) in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read devices file .*nope\.yaml"):
        load_devices_file(tmp_path / "nope.yaml")
