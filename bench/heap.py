"""`--heap-profile`: what the operator's Python heap holds once every SpecServing is Ready, by allocating line.

The operator runs with a sitecustomize (written to the work dir and put first on its PYTHONPATH) that starts
tracemalloc with one frame per allocation a few seconds after start-up, so the imports (kopf and the kubernetes
client: about 80 MiB of the start-up RSS) are not traced and cost nothing, and that writes the top allocation
sites to a file on SIGUSR2, with the allocators' own view (pymalloc's arenas, glibc's mallinfo2) and the RSS before
and after a malloc_trim(0), which separates live memory from memory the allocators hold free. The bench sends the
signal when every SpecServing is Ready and reads the file back.
Tracing slows every allocation, so the run's timings are not comparable with one made without it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

HOOK = '''\
import ctypes, json, os, signal, sys, tempfile, threading, tracemalloc

def _start():
    tracemalloc.start(1)

def _rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

def _pymalloc():
    # sys._debugmallocstats writes to the C-level stderr: catch fd 2 in a file for the call.
    with tempfile.TemporaryFile(mode="w+") as f:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
            ctypes.CDLL(None).fflush(None)  # C stdio buffers stderr once it is a file
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read()
    wanted = ("# arenas allocated current", "# arenas highwater mark", "bytes in allocated blocks",
              "bytes in available blocks", "unused pools", "Total")
    found = {}
    for line in text.splitlines():
        if "=" in line and any(w in line for w in wanted):
            found.setdefault(line.split("=")[0].strip(), line.split("=")[-1].strip())
    return found

class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

def _glibc():
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {"sbrk_and_arenas_mib": round(info.arena / 2**20, 1), "mmapped_mib": round(info.hblkhd / 2**20, 1),
            "in_use_mib": round(info.uordblks / 2**20, 1), "free_held_mib": round(info.fordblks / 2**20, 1)}, libc

def _deep(obj, seen):
    """Bytes reachable from obj through containers and plain objects, each object counted once in `seen`."""
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, type(_deep), type(sys))):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys()); stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, (str, bytes, int, float, bool)) or o is None:
            pass
        else:
            stack.extend(getattr(o, "__dict__", {}).values())
            for slot in getattr(type(o), "__slots__", ()):
                if hasattr(o, slot):
                    stack.append(getattr(o, slot))
    return total

def _holders():
    # The operator's own holders: each attribute of the Controller, and each index (kopf's or an informer's) by name.
    import gc
    gc.unfreeze()  # the runner freezes what start-up made (the Controller too); get_objects skips frozen objects
    found = {}
    for o in gc.get_objects():
        if type(o).__name__ == "Controller" and type(o).__module__ == "specserving.reconcile.controller":
            seen = set()
            for name, index in sorted((getattr(o, "indices", None) or {}).items()):
                # kopf's index and our informers' views both give an iterable of summaries per key.
                found[f"index {name}"] = round(_deep({k: list(v) for k, v in index.items()}, seen) / 2**20, 2)
            # Each SpecServing's state, field by field (summed over all of them), before what may refer to it.
            fields = {}
            for state in getattr(o, "owners", {}).values():
                for name in getattr(type(state), "__slots__", ()) or vars(state):
                    fields[name] = fields.get(name, 0) + _deep(getattr(state, name, None), seen)
            for name, size in sorted(fields.items()):
                found[f"controller.owners[*].{name}"] = round(size / 2**20, 2)
            for name in sorted(n for n in dir(o) if not n.startswith("__")):
                value = getattr(o, name, None)
                if name != "indices" and not callable(value):
                    found[f"controller.{name}"] = round(_deep(value, seen) / 2**20, 2)
    return found

def _retainers(samples=60, depth=6):
    """What keeps decoded JSON alive: for a sample of dicts that json.decoder allocated, the chain of referrers
    up to the first object that is not a dict or list, counted by that chain."""
    import gc, random
    gc.unfreeze()
    decoded = []
    for o in gc.get_objects():
        if type(o) is dict:
            tb = tracemalloc.get_object_traceback(o)
            if tb is not None and tb[0].filename.endswith("json/decoder.py"):
                decoded.append(o)
    chains = {}
    sample = random.sample(decoded, min(samples, len(decoded)))
    mine = {id(decoded), id(sample)}
    for o in sample:
        path, current, seen = [], o, set(mine)
        for _ in range(depth):
            refs = [r for r in gc.get_referrers(current) if id(r) not in seen
                    and type(r).__name__ not in ("frame", "function", "list_iterator")]
            if not refs:
                path.append("?")
                break
            current = refs[0]
            del refs  # it refers to `current` too
            seen.add(id(current))
            name = f"{type(current).__module__}.{type(current).__qualname__}"
            if type(current) is dict:
                path.append(f"dict{list(current)[:4]}")
                continue
            if isinstance(current, (list, tuple)):
                path.append(type(current).__name__)
                continue
            path.append(name)
            break
        key = " <- ".join(path)
        chains[key] = chains.get(key, 0) + 1
    return {"decoded_dicts": len(decoded), "chains": sorted(chains.items(), key=lambda kv: -kv[1])[:25]}

def _dump(signum, frame):
    out = os.environ["SPECSERVING_HEAP_OUT"]
    snapshot = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    top = [{"where": str(s.traceback[0]), "kib": round(s.size / 1024, 1), "count": s.count}
           for s in snapshot.statistics("lineno")[:60]]
    try:
        retainers = _retainers()
    except Exception as exc:
        retainers = {"error": repr(exc)}
    del snapshot  # its traces (a tuple per live block) would count in pymalloc's figures below
    rss = _rss_mib()
    # pymalloc reports nothing while tracemalloc's hooks sit in front of it; the run's last snapshot is taken.
    tracemalloc.stop()
    found = {"traced_mib": round(current / 2**20, 1), "traced_peak_mib": round(peak / 2**20, 1), "top": top,
             "rss_mib": round(rss, 1), "pymalloc": _pymalloc(), "threads": threading.active_count(),
             "holders_mib": _holders(), "retainers": retainers}
    try:
        found["glibc"], libc = _glibc()
        libc.malloc_trim(0)  # what RSS is free memory glibc holds, rather than live
        found["rss_after_malloc_trim_mib"] = round(_rss_mib(), 1)
    except (OSError, AttributeError) as exc:
        found["glibc"] = {"error": str(exc)}
    with open(out + ".tmp", "w") as f:
        json.dump(found, f)
    os.replace(out + ".tmp", out)

if os.environ.get("SPECSERVING_HEAP_OUT"):
    _timer = threading.Timer(float(os.environ.get("SPECSERVING_HEAP_DELAY", "10")), _start)
    _timer.daemon = True
    _timer.start()
    signal.signal(signal.SIGUSR2, _dump)
'''

def env_for(work: Path) -> dict[str, str]:
    """The environment additions that make the operator traceable."""
    hook_dir = work / "heap-hook"
    hook_dir.mkdir(parents=True, exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    return {"PYTHONPATH": str(hook_dir) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "SPECSERVING_HEAP_OUT": str(work / "heap.json")}


def snapshot(pid: int, work: Path, n: int, timeout: float = 120.0) -> dict[str, Any]:
    """Ask the operator for its heap now; the top sites, per SpecServing too."""
    out = work / "heap.json"
    out.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while not out.exists():
        if time.monotonic() > deadline:
            return {"error": f"no heap snapshot in {out} after {timeout:.0f} s"}
        time.sleep(0.5)
    found: dict[str, Any] = json.loads(out.read_text())
    for site in found["top"]:
        site["kib_per_specserving"] = round(site["kib"] / n, 2)
    (work / f"heap-{n}.json").write_text(json.dumps(found, indent=1))
    return found
