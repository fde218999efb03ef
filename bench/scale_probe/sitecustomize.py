"""What bench/scale.py measures inside every process of a run: CPU-seconds at the phase boundaries, the collectives
and store operations each process issues (by whose code), and its peak RSS.

Python imports ``sitecustomize`` at start-up from the first ``sys.path`` entry that has one: bench/scale.py puts
this folder first on ``PYTHONPATH`` of the nodes it starts (agents and workers inherit it) and names a folder in
``SCALE_PROBE_DIR``; without that variable this module does nothing. Each process writes
``$SCALE_PROBE_DIR/<pid>.json`` after each phase and at exit (a process killed with SIGKILL keeps its last one).

Nothing here is distqa-specific except the names of the functions that mark a phase; the bare floor
(bench/scale_floor.py) is measured by the same hooks (``init_process_group``, DDP's constructor, the optimizer's
step), so its figures and ours are comparable phase by phase:

- ``imports``: the interpreter's start to ``init_process_group`` (ours: imports, settings, task; the floor: imports);
- ``process_group``: ``init_process_group`` itself (the store, gloo's connections to every peer);
- ``preflight`` (ours): ``distqa.training.preflight.check_at_training_start``;
- ``data_and_model``: to the end of ``DistributedDataParallel.__init__`` (data, model, resume, the wrap);
- ``first_step``: to the end of the first ``Optimizer.step`` (optimizer, the first forward and backward);
- ``steps``: the CPU between consecutive optimizer steps' ends (the log line's gather and the stop check included);
- ``saves`` (ours): ``Trainer.save_checkpoint``; ``survivor_save``: ``save_what_survives``;
- agents: ``watcher_reads`` (each read of distqa's rendezvous watcher), ``rendezvous`` (torch's
  ``DynamicRendezvousHandler.next_rendezvous``, one entry per round) and
  ``workers_started`` (the agent's CPU when ``LocalElasticAgent._start_workers`` returns).

Collectives are counted where they are called through ``torch.distributed.<name>``, the public namespace (the calls
torch makes inside ``distributed_c10d`` are not: one call, one count), with the bytes this rank sends and receives;
store operations on ``TCPStore`` and ``PrefixStore`` objects (torch's C++ process-group code talks to its store
without Python, so these are the Python-level users: torch's elastic agent, and distqa). Each is attributed to the
first frame outside torch: ``distqa`` (src/distqa), ``task`` (examples/), or ``torch`` when torch itself called.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import pickle
import resource
import sys
import time
from typing import Any

DIRECTORY = os.environ.get("SCALE_PROBE_DIR", "")


class Probe:
    """One process's figures, written as JSON."""

    def __init__(self) -> None:
        with open("/proc/self/cmdline", "rb") as cmdline:
            argv = [part.decode(errors="replace") for part in cmdline.read().split(b"\0") if part]
        role = "worker" if "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ else \
            "agent" if any(m in argv for m in ("distqa.launch.node", "torch.distributed.run")) else "other"
        self.record: dict[str, Any] = {
            "pid": os.getpid(), "role": role, "argv": argv, "rank": _int_env("RANK"),
            "group_rank": _int_env("GROUP_RANK"), "restart": _int_env("TORCHELASTIC_RESTART_COUNT"),
            "world_size": _int_env("WORLD_SIZE"), "node": os.environ.get("SCALE_NODE", ""),
            "started_wall": time.time(), "marks": {}, "steps": [], "step_walls": [], "saves": [], "survivor_saves": [],
            "watcher_reads": [],
            "rendezvous": [], "calls": {}, "bytes": {}}
        self.record["marks"]["start"] = time.process_time()
        self.last_step_cpu: float | None = None
        self.region = ""
        """The call being timed that the collectives and store operations fall in (a save), else ""."""

    def mark(self, name: str) -> None:
        """The process's CPU-seconds now, under ``name`` (the first time only) with the wall clock beside it."""
        marks = self.record["marks"]
        if name not in marks:
            marks[name] = time.process_time()
            marks[f"{name}_wall"] = time.time()
            self.write()

    def count(self, kind: str, name: str, sent: int, received: int) -> None:
        who = _caller(self.record["role"])
        key = f"{kind}:{name}:{who}:{self.phase()}"
        self.record["calls"][key] = self.record["calls"].get(key, 0) + 1
        self.record["bytes"][key] = self.record["bytes"].get(key, 0) + sent + received

    def phase(self) -> str:
        """The phase a call falls in, from the marks so far."""
        if self.region:
            return self.region
        marks = self.record["marks"]
        for name in ("first_step", "data_and_model", "preflight", "process_group"):
            if name in marks:
                return {"process_group": "preflight", "preflight": "data_and_model", "data_and_model": "first_step",
                        "first_step": "steps"}[name]
        return "process_group" if "imports" in marks else "start"

    def step_done(self) -> None:
        now = time.process_time()
        if self.last_step_cpu is None:
            self.mark("first_step")
        else:
            self.record["steps"].append(now - self.last_step_cpu)
            self.record["step_walls"].append(time.time())
        self.last_step_cpu = now

    def write(self) -> None:
        self.record["cpu_s"] = time.process_time()
        self.record["max_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        path = os.path.join(DIRECTORY, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as out:
            json.dump(self.record, out)
        os.replace(path + ".tmp", path)


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _caller(role: str) -> str:
    """Whose code made the call. In a worker, the first frame outside torch: torch works there on behalf of the code
    that called it (DCP's collectives for distqa's sharded save). In an agent, torch's elastic agent runs everything:
    only a call from distqa's own frame, or from a thread distqa started (the rendezvous watcher), is distqa's."""
    import threading  # here: this module's start-up stays as small as it can be in processes that never count

    frame = sys._getframe(3)  # _caller <- Probe.count <- the wrapper <- the caller
    if role != "worker":
        path = frame.f_code.co_filename
        ours = "/distqa/" in path or threading.current_thread().name.startswith("distqa")
        return "distqa" if ours else "torch"
    while frame is not None:
        path = frame.f_code.co_filename
        if "/torch/" not in path and not path.endswith("sitecustomize.py") and "/contextlib.py" not in path:
            return "distqa" if "/distqa/" in path else "task" if "/examples/" in path else "other"
        frame = frame.f_back
    return "torch"


def _size(obj: Any) -> int:
    try:
        return len(pickle.dumps(obj))
    except Exception:  # an object that does not pickle here is counted as nothing rather than failing the run
        return 0


def _tensor_bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size() if hasattr(tensor, "element_size") else 0


def _timed(probe: Probe, owner: Any, attribute: str, before: str | None, after: str | None,
           each: str | None = None) -> None:
    """Wrap ``owner.attribute`` to mark ``before`` as it is entered, ``after`` as it returns, and append its CPU-seconds
    to ``probe.record[each]`` (the calls inside it then count under the region ``each``)."""
    original = getattr(owner, attribute)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before:
            probe.mark(before)
        started = time.process_time()
        outer, probe.region = probe.region, each or probe.region
        try:
            return original(*args, **kwargs)
        finally:
            probe.region = outer
            if each:
                probe.record[each].append(time.process_time() - started)
                probe.write()
            if after:
                probe.mark(after)

    setattr(owner, attribute, wrapper)


def _count_collectives(probe: Probe, dist: Any) -> None:
    """Count the public collectives: bytes this rank sends and receives (objects as pickled)."""
    def wrap(name: str, measure: Any) -> None:
        original = getattr(dist, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                sent, received = measure(dist, args, kwargs)
            except Exception:  # a call shape not foreseen is still counted, with no bytes
                sent, received = 0, 0
            probe.count("collective", name, sent, received)
            return result
        setattr(dist, name, wrapper)

    def rank(d: Any) -> int:
        return d.get_rank()

    wrap("all_gather_object", lambda d, a, k: (_size(a[1]), sum(_size(o) for o in a[0])))
    wrap("broadcast_object_list", lambda d, a, k: ((_size(a[0]), 0) if rank(d) == k.get("src", a[1] if len(a) > 1
                                                                                       else 0) else (0, _size(a[0]))))
    wrap("gather_object", lambda d, a, k: (_size(a[0]), sum(_size(o) for o in (a[1] if len(a) > 1 else
                                                                                 k.get("object_gather_list")) or [])))
    wrap("all_reduce", lambda d, a, k: (_tensor_bytes(a[0]), _tensor_bytes(a[0])))
    wrap("broadcast", lambda d, a, k: (_tensor_bytes(a[0]), 0) if rank(d) == k.get("src", a[1] if len(a) > 1 else 0)
         else (0, _tensor_bytes(a[0])))
    wrap("all_gather", lambda d, a, k: (_tensor_bytes(a[1]), sum(_tensor_bytes(t) for t in a[0])))
    wrap("gather", lambda d, a, k: (_tensor_bytes(a[0]), sum(_tensor_bytes(t) for t in (k.get("gather_list") or
                                                                                        (a[1] if len(a) > 1 else None)
                                                                                        or []))))
    wrap("barrier", lambda d, a, k: (0, 0))


def _count_store(probe: Probe, dist: Any) -> None:
    """Count the store operations made from Python on TCPStore and PrefixStore objects."""
    for store_class in (dist.TCPStore, dist.PrefixStore):
        for name in ("set", "get", "add", "compare_set", "check", "wait", "delete_key", "multi_get", "multi_set",
                     "append", "num_keys"):
            original = getattr(store_class, name, None)
            if original is None:
                continue

            def wrapper(self: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                result = _original(self, *args, **kwargs)
                payload = sum(len(a) for a in args if isinstance(a, bytes | str))
                returned = len(result) if isinstance(result, bytes | str) else \
                    sum(len(r) for r in result if isinstance(r, bytes)) if isinstance(result, list) else 0
                probe.count("store", _name, payload, returned)
                return result
            setattr(store_class, name, wrapper)


def _install(probe: Probe) -> None:
    patches = {
        "torch.distributed": lambda m: (_count_collectives(probe, m), _count_store(probe, m),
                                        _timed(probe, m, "init_process_group", "imports", "process_group")),
        "torch.nn.parallel.distributed": lambda m: _timed(probe, m.DistributedDataParallel, "__init__", None,
                                                          "data_and_model"),
        "torch.optim.optimizer": lambda m: _wrap_optimizer_step(probe, m),
        "distqa.training.preflight": lambda m: _timed(probe, m, "check_at_training_start", None, "preflight"),
        "distqa.training.trainer": lambda m: _timed(probe, m.Trainer, "save_checkpoint", None, None, "saves"),
        "distqa.training.peer_loss": lambda m: _timed(probe, m, "save_what_survives", "peer_lost", "survivor_saved",
                                                         "survivor_saves"),
        "distqa.launch.rendezvous_watcher": lambda m: _timed(probe, m.RendezvousWatcher, "_read", None, None,
                                                             "watcher_reads"),
        "torch.distributed.elastic.rendezvous.dynamic_rendezvous":
            lambda m: _timed(probe, m.DynamicRendezvousHandler, "next_rendezvous", None, None, "rendezvous"),
        "torch.distributed.elastic.agent.server.local_elastic_agent":
            lambda m: _timed(probe, m.LocalElasticAgent, "_start_workers", None, "workers_started"),
    }
    sys.meta_path.insert(0, _PatchingFinder(patches))
    atexit.register(probe.write)
    probe.write()


def _wrap_optimizer_step(probe: Probe, module: Any) -> None:
    """Every optimizer's ``step`` ends a training step; the hook runs after ``Optimizer.__init__`` wraps each subclass's
    step (``Optimizer._patch_step_function``), so it is installed on the profiling hook torch calls there instead."""
    module.register_optimizer_step_post_hook(lambda optimizer, args, kwargs: probe.step_done())


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Applies a patch to a module right after it executes, before its importer binds any name from it."""

    def __init__(self, patches: dict[str, Any]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in self.patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, self.patches.pop(name)
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            patch(module)
        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if DIRECTORY:
    PROBE = Probe()
    _install(PROBE)
