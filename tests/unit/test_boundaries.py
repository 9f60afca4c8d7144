"""The package boundaries of DESIGN §3 (issue 8): the control plane imports no torch, ignisd.cache never imports
ignisd.model, and the scheduler touches no cache module but the manager. Checked on the real source tree (ast) and
in a fresh interpreter with torch blocked."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Every control-plane module (DESIGN §3 marks them †). cache/kv_store.py (with exact_window.py, its exact-window
# writes split out), state_store.py, host_arena.py and transfer.py are the tensor storage behind the pools and the
# copies between them (DESIGN §3 lists kv_store.py, host_arena.py and transfer.py without †): they are the only
# cache modules left out.
CONTROL_PLANE = [
    "ignisd.scheduler", "ignisd.sequence", "ignisd.plan", "ignisd.traversal", "ignisd.request", "ignisd.vocab",
    "ignisd.buffers", "ignisd.config", "ignisd.config_keys", "ignisd.log", "ignisd.metrics", "ignisd.preflight",
    "ignisd.engine", "ignisd.edge", "ignisd.edge_events", "ignisd.prompt", "ignisd.server", "ignisd.fronts.ndjson",
    "ignisd.unix_socket", "ignisd.fronts.sse", "ignisd.fronts.http", "ignisd.fronts.openai", "ignisd.fronts.anthropic",
    "ignisd.fronts.anthropic_request", "ignisd.fronts.responses", "ignisd.fronts.responses_request",
    "ignisd.fronts.chat_body",
    "ignisd.cache.manager", "ignisd.cache.placement", "ignisd.cache.page_pool", "ignisd.cache.state_slots",
    "ignisd.cache.prefix_index", "ignisd.cache.retained", "ignisd.cache.retained_state", "ignisd.cache.kv_format",
    "ignisd.cache.extents", "ignisd.cache.tiers", "ignisd.cache.disk_format", "ignisd.cache.disk_io",
    "ignisd.cache.disk_direct", "ignisd.cache.disk_hash", "ignisd.cache.disk_store",
    "ignisd.disk_traffic", "ignisd.cache.disk_states", "ignisd.cache.live_eviction", "ignisd.eviction",
    "ignisd.cache.admission", "ignisd.cache.ranking", "ignisd.reuse_report",
    "ignis_client.protocol", "ignis_client.divergence", "ignis_client.status_view",
    "ignisd.systemd", "ignisd.health", "ignisd.lifecycle", "ignisd.reload", "ignisd.progress", "ignisd.install_unit",
]
# The one kernels module the control plane may read: the hq-e8-2b seed, a constant that both the rotation and the
# cache stamp (cache/kv_format.py) name, in a module that imports nothing.
KERNEL_CONSTANTS = ["ignis_kernels", "ignis_kernels.hq_seed"]
STORAGE = {"kv_store.py", "exact_window.py", "state_store.py", "host_arena.py", "transfer.py"}


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    parts[0] = {"ignisd": "ignisd", "kernels": "ignis_kernels", "client": "ignis_client"}[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file (lazy imports inside functions included), with
    relative imports resolved."""
    tree = ast.parse(path.read_text())
    pkg = _package_of(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _package_of(path)
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg.split(".")[:len(pkg.split(".")) - n.level + 1]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in n.names}
    return out


def test_the_control_plane_imports_without_torch():
    code = ("import sys\n"
            f"KERNEL_CONSTANTS = {KERNEL_CONSTANTS!r}\n"
            "sys.modules['torch'] = None\n"
            f"import importlib\nfor m in {CONTROL_PLANE!r}:\n    importlib.import_module(m)\n"
            "bad = [m for m in sys.modules if m.startswith('torch') and sys.modules[m] is not None]\n"
            "assert not bad, bad\n"
            "kern = sorted(m for m in sys.modules if m.startswith('ignis_kernels'))\n"
            "assert 'ignisd.model' not in sys.modules and kern in ([], KERNEL_CONSTANTS), kern\n"
            "print('ok', len(" + repr(CONTROL_PLANE) + "))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", str(len(CONTROL_PLANE))]


def test_the_kernel_constants_the_control_plane_reads_import_nothing():
    path = ROOT / "kernels" / "hq_seed.py"
    assert _imports(path) <= {"__future__", "__future__.annotations"}
    assert (ROOT / "kernels" / "__init__.py").read_text().strip() == ""


def test_every_cache_module_but_the_storage_is_in_the_torch_free_list():
    cache = {p.name for p in (ROOT / "ignisd" / "cache").glob("*.py")} - {"__init__.py"}
    listed = {m.rsplit(".", 1)[1] + ".py" for m in CONTROL_PLANE if m.startswith("ignisd.cache.")}
    assert cache - STORAGE == listed, "a new cache module must be torch-free (add it) or tensor storage"


def test_cache_never_imports_model():
    for path in sorted((ROOT / "ignisd" / "cache").glob("*.py")):
        bad = sorted(m for m in _imports(path) if m == "ignisd.model" or m.startswith("ignisd.model."))
        assert not bad, f"{path.name} imports {bad}"


def test_the_scheduler_reaches_the_cache_only_through_the_manager():
    for name in ("scheduler.py", "sequence.py", "plan.py", "traversal.py"):
        mods = _imports(ROOT / "ignisd" / name)
        cache = sorted({m for m in mods if m.startswith("ignisd.cache")} - {"ignisd.cache.manager"}
                       - {f"ignisd.cache.manager.{x}" for x in ("CacheManager", "ReuseMatch", "Admission")})
        assert not cache, f"{name} imports {cache}"


def test_the_model_imports_no_cache_module():
    for path in sorted((ROOT / "ignisd" / "model").glob("*.py")):
        bad = sorted(m for m in _imports(path) if m.startswith("ignisd.cache"))
        assert not bad, f"model/{path.name} imports {bad}"


def test_the_walker_sees_lazy_and_relative_imports(tmp_path):
    """The check above must be able to fail: a lazy import inside a function and a relative import are found."""
    f = ROOT / "ignisd" / "cache" / "_probe_tmp.py"
    try:
        f.write_text("def f():\n    from ignisd.model.spec import ModelSpec\n    from ..model import loader\n")
        mods = _imports(f)
        assert "ignisd.model.spec" in mods and "ignisd.model" in mods
    finally:
        f.unlink()
