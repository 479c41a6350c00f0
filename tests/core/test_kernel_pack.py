"""Kernel packs (flashinfer/kernel_pack.py): export from a Triton cache, seed another, staleness."""

from __future__ import annotations

import json
import sysconfig
import tarfile

import pytest

from flashinfer import kernel_pack as KP

SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")

pytest.importorskip("triton")


def _fake_entry(cache, key: str, kernel: str, cubin: bytes):
    """One compiled-kernel entry laid out as Triton's FileCacheManager writes it."""
    d = cache / key
    d.mkdir(parents=True)
    files = {f"{kernel}.cubin": cubin, f"{kernel}.json": json.dumps({"name": kernel}).encode(),
             f"{kernel}.ttir": b"module {}", f"{kernel}.ptx": b"// ptx"}
    for name, data in files.items():
        (d / name).write_bytes(data)
    group = {"child_paths": {name: str(d / name) for name in files}}
    (d / f"__grp__{kernel}.json").write_text(json.dumps(group))


@pytest.fixture
def exported(tmp_path):
    src = tmp_path / "warm_cache"
    _fake_entry(src, "KEYA", "sample_probs_kernel", b"\x7fELF-a")
    _fake_entry(src, "KEYB", "softmax_kernel", b"\x7fELF-b")
    launcher = src / "KEYC"
    launcher.mkdir()
    (launcher / f"__triton_launcher{SUFFIX}").write_bytes(b"host code")  # packed
    other = src / "KEYF"
    other.mkdir()
    (other / "libsomething.so").write_bytes(b"not Triton's")  # not packed
    (src / "KEYD").mkdir()  # an entry of a kernel that is not ours: not packed
    _fake_entry(src, "KEYE", "somebody_elses_kernel", b"\x7fELF-e")
    packs = tmp_path / "packs"
    manifest = KP.export_pack(src, packs / KP.pack_name("9.9.9", 90), "9.9.9", 90)
    return packs, manifest


def test_export_keeps_binary_metadata_and_group_of_our_kernels_only(exported):
    packs, manifest = exported
    assert [(e["key"], e["kernel"], e["module"]) for e in manifest["entries"]] == [
        ("KEYA", "sample_probs_kernel", "_sampling_kernels"),
        ("KEYB", "softmax_kernel", "_sampling_kernels")]
    assert manifest["modules"] == {"_sampling_kernels": KP.module_digest("_sampling_kernels")}
    with tarfile.open(packs / "triton-9.9.9-sm90.tar.xz") as tar:
        names = sorted(tar.getnames())
    assert names == ["KEYA/sample_probs_kernel.cubin", "KEYA/sample_probs_kernel.json",
                     "KEYB/softmax_kernel.cubin", "KEYB/softmax_kernel.json",
                     f"KEYC/__triton_launcher{SUFFIX}", "manifest.json"]
    assert manifest["host_modules"] == [{"key": "KEYC", "file": f"__triton_launcher{SUFFIX}"}]


def test_seed_writes_what_triton_looks_up_and_only_what_is_missing(exported, tmp_path, monkeypatch):
    packs, _ = exported
    cache = tmp_path / "user_cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.setenv("FLASHINFER_KERNEL_PACK_DIR", str(packs))
    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    assert KP._seed("9.9.9", 90) == 3  # two kernels, one launcher
    assert (cache / "KEYC" / f"__triton_launcher{SUFFIX}").read_bytes() == b"host code"
    group = json.loads((cache / "KEYA" / "__grp__sample_probs_kernel.json").read_text())["child_paths"]
    assert sorted(group) == ["sample_probs_kernel.cubin", "sample_probs_kernel.json"]
    assert open(group["sample_probs_kernel.cubin"], "rb").read() == b"\x7fELF-a"
    assert KP._seed("9.9.9", 90) == 0  # present: nothing copied again
    assert KP._seed("9.9.9", 80) == 0  # no pack for this arch
    assert KP._seed("1.0.0", 90) == 0  # nor for this Triton


def test_stale_entries_are_skipped_and_reported(exported, tmp_path, monkeypatch):
    packs, manifest = exported
    manifest["modules"]["_sampling_kernels"] = "0" * 64  # compiled from older source
    path = packs / "triton-9.9.9-sm90.tar.xz"
    with tarfile.open(path) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.name != "manifest.json"}
    with tarfile.open(path, "w:xz") as tar:
        KP._add(tar, "manifest.json", json.dumps(manifest).encode())
        for name, data in members.items():
            KP._add(tar, name, data)
    assert len(KP.stale_entries(manifest)) == 2
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user_cache"))
    monkeypatch.setenv("FLASHINFER_KERNEL_PACK_DIR", str(packs))
    assert KP._seed("9.9.9", 90) == 1  # only the launcher: no kernel source behind it
    assert not (tmp_path / "user_cache" / "KEYA").exists()
    assert any("2 STALE" in line for line in KP.describe())


def test_no_seeding_when_off_or_with_a_custom_cache_manager(exported, tmp_path, monkeypatch):
    packs, _ = exported
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user_cache"))
    monkeypatch.setenv("FLASHINFER_KERNEL_PACK_DIR", "off")
    assert KP._seed("9.9.9", 90) == 0
    assert KP.describe() == ["kernel packs: off (FLASHINFER_KERNEL_PACK_DIR=off)"]
    monkeypatch.setenv("FLASHINFER_KERNEL_PACK_DIR", str(packs))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "mymodule:MyCache")
    assert KP._seed("9.9.9", 90) == 0
    assert not (tmp_path / "user_cache").exists()


def test_shipped_packs_match_the_kernel_sources():
    """A packed kernel whose source changed is never loaded (Triton's key differs): re-export the
    pack on a GPU with ``flashinfer warmup --export-pack`` (see flashinfer/kernel_pack.py)."""
    for path in sorted(KP.SHIPPED_DIR.glob("triton-*-sm*.tar.xz")):
        stale = KP.stale_entries(KP.read_manifest(path))
        assert not stale, f"{path.name}: stale entries {sorted({e['kernel'] for e in stale})}"


def test_a_damaged_pack_warns_and_is_skipped(tmp_path, monkeypatch):
    import triton

    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / KP.pack_name(triton.__version__, 77)).write_bytes(b"not an xz archive")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user_cache"))
    monkeypatch.setenv("FLASHINFER_KERNEL_PACK_DIR", str(packs))
    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    monkeypatch.setattr(KP, "_seeded", {})
    with pytest.warns(RuntimeWarning, match="kernel pack not used"):
        assert KP.seed_triton_cache(77) == 0
    assert KP.seed_triton_cache(77) == 0  # once per process and arch: no second warning


def test_a_module_digest_covers_the_kernel_modules_it_imports_helpers_from(tmp_path, monkeypatch):
    (tmp_path / "_base_kernels.py").write_text("import triton\n")
    (tmp_path / "_user_kernels.py").write_text("from ._base_kernels import helper\n")
    monkeypatch.setattr(KP, "KERNEL_MODULE_DIR", tmp_path)
    import hashlib

    assert KP.module_digest("_base_kernels") == hashlib.sha256(b"import triton\n").hexdigest()
    before = KP.module_digest("_user_kernels")
    (tmp_path / "_base_kernels.py").write_text("import triton  # changed\n")
    assert KP.module_digest("_user_kernels") != before


def test_the_module_docstring_does_not_enter_the_digest():
    from flashinfer.kernel_pack import _code_of

    a = b'"""One prose."""\n\nimport triton\n\nX = 1\n'
    b = b'"""Other prose,\nover two lines."""\n\nimport triton\n\nX = 1\n'
    c = b'"""One prose."""\n\nimport triton\n\nX = 2\n'
    assert _code_of(a) == _code_of(b) != _code_of(c)
    assert _code_of(b"X = 1\n") == b"X = 1\n"  # no docstring: the source as is
