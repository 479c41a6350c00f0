"""Compiled Triton kernels shipped with the package, so a first call need not compile.

A cold Triton compile of one sampling kernel takes 2-2.5 s on the H200's host (benchmarks/
compile_time.py); a first call in a fresh process then took 3.4-4.5 s. A *kernel pack* holds
Triton cache entries made by ``flashinfer warmup --export-pack`` on a GPU: for each kernel the
cubin, its metadata and the group file that Triton looks up, and the host-side modules Triton
builds with the C compiler for them (its ``cuda_utils`` and one ``__triton_launcher`` per kernel
signature, about 0.3 s of gcc each). On the first launch of one of our Triton kernels in a
process, :func:`seed_triton_cache` copies the pack's entries that Triton's on-disk cache lacks
into it; Triton then finds them under its own cache keys and loads them.

Safe by construction: Triton's key hashes the kernel source, the Triton build, the target and
the compile options, so an entry made from other source or for another Triton or GPU is never
looked up (it only costs disk). A host module's key hashes its C source and the machine and OS;
its file name carries the Python ABI, so another Python never looks it up either, and one that
does not load (an older C library) is rebuilt by Triton, with a warning. Packs are per Triton
version and target (``triton-<version>-sm<arch>.tar.xz``). The manifest records a digest of each
kernel module an entry came from (and of the kernel modules it imports helpers from); entries
whose module has changed since the export are skipped, and ``flashinfer show-config`` and the
test suite report them: re-export the pack on a GPU (``flashinfer warmup --export-pack``)
whenever a packed kernel changes.

Nothing is seeded when Triton uses a custom cache manager (``TRITON_CACHE_MANAGER``), or with
``FLASHINFER_KERNEL_PACK_DIR=off``; an unwritable cache or a damaged pack only warns (Triton then
compiles).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
import sysconfig
import tarfile
import tempfile
import threading
import warnings
from pathlib import Path

from . import envs

#: the packs shipped with the package
SHIPPED_DIR = Path(__file__).parent / "kernel_packs"
#: the kernel modules a pack may hold kernels of (digested in the manifest)
KERNEL_MODULE_DIR = Path(__file__).parent / "backends" / "triton"
#: the files of a cache entry a pack keeps: the binary, its metadata, the group file
_KEPT_SUFFIXES = (".cubin", ".hsaco", ".json")


def _host_module_names(suffix: str) -> tuple[str, ...]:
    """File names of the host modules Triton's NVIDIA driver builds (``EXT_SUFFIX``: this
    Python's extension suffix)."""
    return (f"cuda_utils{suffix}", f"__triton_launcher{suffix}")

_lock = threading.Lock()
_seeded: dict[tuple[str, int], int] = {}


def pack_dir() -> Path | None:
    raw = envs.KERNEL_PACK_DIR.get()
    if raw is None:
        return SHIPPED_DIR
    return None if raw.lower() == "off" else Path(os.path.expanduser(raw))


def pack_name(triton_version: str, arch: int) -> str:
    return f"triton-{triton_version}-sm{arch}.tar.xz"


def _code_of(source: bytes) -> bytes:
    """A module's source without its module docstring, which no @triton.jit function's key
    reads: editing the prose does not make a pack stale. A file that opens with a triple-quoted
    docstring (no backslash in it) is cut after the line that closes it (what the ``ast`` form below gives, without parsing the
    file: seeding digests every kernel module, 0.35 s of parsing on the H200's host)."""
    if source.startswith(b'"""'):
        close = source.find(b'"""', 3)
        if close != -1 and b"\\" not in source[:close]:
            line_end = source.find(b"\n", close)
            return b"" if line_end == -1 else source[line_end + 1:]
    tree = ast.parse(source)
    first = tree.body[0] if tree.body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        lines = source.splitlines(keepends=True)
        return b"".join(lines[:first.lineno - 1] + lines[first.end_lineno:])
    return source


def module_digest(module: str) -> str:
    """sha256 of a kernel module's code (``_sampling_kernels`` -> its file, without the module
    docstring), chained with the digests of the kernel modules it imports @triton.jit helpers
    from (Triton's key covers them too)."""
    source = _code_of((KERNEL_MODULE_DIR / f"{module}.py").read_bytes())
    used = sorted(set(re.findall(rb"^from \.(_\w+_kernels) import", source, re.MULTILINE)))
    digest = hashlib.sha256(source)
    for dep in used:
        digest.update(module_digest(dep.decode()).encode())
    return digest.hexdigest()


def triton_cache_dir() -> Path | None:
    """Triton's file cache directory, or None when Triton uses another cache manager."""
    if os.environ.get("TRITON_CACHE_MANAGER"):
        return None
    try:
        from triton import knobs
        return Path(knobs.cache.dir)
    except ImportError:  # Triton < 3.4
        from triton.runtime.cache import default_cache_dir
        return Path(os.environ.get("TRITON_CACHE_DIR") or default_cache_dir())


def read_manifest(path: Path) -> dict:
    with tarfile.open(path, "r:xz") as tar:
        return json.load(tar.extractfile("manifest.json"))


def stale_entries(manifest: dict) -> list[dict]:
    """The manifest's entries whose kernel module differs from the one they were compiled from."""
    digests = {m: (module_digest(m) if (KERNEL_MODULE_DIR / f"{m}.py").exists() else None)
               for m in manifest["modules"]}
    return [e for e in manifest["entries"] if digests[e["module"]] != manifest["modules"][e["module"]]]


_devices_done: set[int] = set()


def seed_for_device(device) -> None:
    """:func:`seed_triton_cache` for a CUDA ``device``'s arch; a set lookup after the first call
    per device (nothing under the Triton interpreter)."""
    index = device.index if device.index is not None else 0
    if index in _devices_done:
        return
    if not envs.TRITON_INTERPRET.get():
        import torch

        major, minor = torch.cuda.get_device_capability(index)
        seed_triton_cache(major * 10 + minor)
    _devices_done.add(index)


def seed_triton_cache(arch: int) -> int:
    """Copy the current Triton's pack entries for ``sm<arch>`` that Triton's cache lacks into it,
    once per process and arch; returns the number of entries copied."""
    import triton

    key = (triton.__version__, arch)
    with _lock:
        if key not in _seeded:
            try:
                _seeded[key] = _seed(triton.__version__, arch)
            except (OSError, tarfile.TarError, ValueError, KeyError) as exc:
                # an optimisation only: an unwritable cache or a damaged pack must not fail the
                # call (Triton then compiles, as without a pack)
                warnings.warn(f"flashinfer: kernel pack not used ({type(exc).__name__}: {exc}); "
                              "Triton compiles the kernels instead", RuntimeWarning, stacklevel=2)
                _seeded[key] = 0
        return _seeded[key]


def _seed(triton_version: str, arch: int) -> int:
    where, cache = pack_dir(), triton_cache_dir()
    if where is None or cache is None:
        return 0
    path = where / pack_name(triton_version, arch)
    if not path.is_file():
        return 0
    copied = 0
    with tarfile.open(path, "r:xz") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        stale = {e["key"] for e in stale_entries(manifest)}
        wanted = {e["key"]: e for e in manifest["entries"]
                  if e["key"] not in stale and not (cache / e["key"] / e["group"]).exists()}
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        hosts = {h["key"]: h for h in manifest.get("host_modules", [])
                 if h["file"].endswith(suffix) and not (cache / h["key"] / h["file"]).exists()}
        if not wanted and not hosts:
            return 0
        files: dict[str, dict[str, bytes]] = {}
        for member in tar:
            entry_key, _, name = member.name.partition("/")
            if (entry_key in wanted or entry_key in hosts) and member.isfile():
                files.setdefault(entry_key, {})[name] = tar.extractfile(member).read()
    for entry_key, entry in wanted.items():
        if _install(cache / entry_key, entry, files.get(entry_key, {})):
            copied += 1
    for entry_key, host in hosts.items():
        blob = files.get(entry_key, {}).get(host["file"])
        if blob is not None:
            (cache / entry_key).mkdir(parents=True, exist_ok=True)
            _atomic_write(cache / entry_key / host["file"], blob)
            copied += 1
    return copied


def _install(dest: Path, entry: dict, blobs: dict[str, bytes]) -> bool:
    """Write one entry the way Triton's FileCacheManager does (each file renamed into place),
    the group file last, so a concurrent process never sees a partial entry as a hit."""
    if set(entry["files"]) - set(blobs):
        return False
    dest.mkdir(parents=True, exist_ok=True)
    for name in entry["files"]:
        _atomic_write(dest / name, blobs[name])
    group = {"child_paths": {name: str(dest / name) for name in entry["files"]}}
    _atomic_write(dest / entry["group"], json.dumps(group).encode())
    return True


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".flashinfer_pack_")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _kernel_module(kernel_name: str) -> str | None:
    """The ``_*_kernels`` module defining the @triton.jit function ``kernel_name``."""
    import importlib

    for file in sorted(KERNEL_MODULE_DIR.glob("_*_kernels.py")):
        mod = importlib.import_module(f"flashinfer.backends.triton.{file.stem}")
        if hasattr(mod, kernel_name):
            return file.stem
    return None


def export_pack(cache: Path, out: Path, triton_version: str, arch: int) -> dict:
    """Write the pack of every compiled kernel of ours found in the Triton cache directory
    ``cache`` (normally a fresh one that a warm-up filled) to ``out``; returns the manifest."""
    entries, hosts, blobs = [], [], {}
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for entry_dir in sorted(p for p in cache.iterdir() if p.is_dir()):
        groups = list(entry_dir.glob("__grp__*.json"))
        host_files = [p.name for p in entry_dir.iterdir() if p.name in _host_module_names(suffix)]
        if not groups and len(host_files) == 1:  # cuda_utils, a launcher
            hosts.append({"key": entry_dir.name, "file": host_files[0]})
            blobs[f"{entry_dir.name}/{host_files[0]}"] = (entry_dir / host_files[0]).read_bytes()
            continue
        if len(groups) != 1:
            continue
        children = json.loads(groups[0].read_text())["child_paths"]
        kept = sorted(n for n in children if n.endswith(_KEPT_SUFFIXES))
        meta = json.loads((entry_dir / groups[0].name[len("__grp__"):]).read_text())
        module = _kernel_module(meta["name"])
        if module is None or not any(n.endswith((".cubin", ".hsaco")) for n in kept):
            continue
        entries.append({"key": entry_dir.name, "kernel": meta["name"], "module": module,
                        "group": groups[0].name, "files": kept})
        for name in kept:
            blobs[f"{entry_dir.name}/{name}"] = (entry_dir / name).read_bytes()
    modules = sorted({e["module"] for e in entries})
    manifest = {"triton": triton_version, "arch": arch,
                "modules": {m: module_digest(m) for m in modules}, "entries": entries,
                "host_modules": hosts}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:xz") as tar:
        _add(tar, "manifest.json", json.dumps(manifest, indent=1).encode())
        for name, data in sorted(blobs.items()):
            _add(tar, name, data)
    return manifest


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def describe() -> list[str]:
    """show-config lines: each pack found, its entries and the stale ones."""
    where = pack_dir()
    if where is None:
        return ["kernel packs: off (FLASHINFER_KERNEL_PACK_DIR=off)"]
    packs = sorted(where.glob("triton-*-sm*.tar.xz")) if where.is_dir() else []
    if not packs:
        return [f"kernel packs: none in {where}"]
    lines = []
    for path in packs:
        manifest = read_manifest(path)
        stale = stale_entries(manifest)
        kernels = sorted({e["kernel"] for e in manifest["entries"]})
        note = f", {len(stale)} STALE (kernel source changed; re-export)" if stale else ""
        hosts = len(manifest.get("host_modules", []))
        lines.append(f"kernel pack {path.name}: {len(manifest['entries'])} compiled kernels "
                     f"({', '.join(kernels)}), {hosts} host modules{note}")
    return lines
