"""Which stack frame is "the call site" of a collective.

The user site is the innermost frame outside torch, DeepSpeed and this tracer: the line a person
would edit. Files of the rest of ``repro`` (workers, scenarios) and of tests and scripts count as
user code. For calls made inside a library (DeepSpeed's gradient reduction, torch's FSDP) the
innermost library frame is kept as the "library site" too, since that names the mechanism.
"""

from __future__ import annotations

import os
import re
import sys
from types import FrameType

_USER, _LIBRARY, _PLUMBING = 0, 1, 2


def _package_dir(name: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0]) + os.sep


_REPRO_DIR = os.path.realpath(os.path.dirname(os.path.dirname(__file__))) + os.sep
_TRACER_PREFIXES = (
    os.path.join(_REPRO_DIR, "collectives") + os.sep,
    os.path.join(_REPRO_DIR, "collectives_trace.py"),
)
_DEEPSPEED_DIR = _package_dir("deepspeed")
_LIBRARY_DIRS = tuple(d for d in (_package_dir("torch"), _DEEPSPEED_DIR) if d)
# Frames of the communication wrappers themselves (torch.distributed's entry points,
# deepspeed.comm) say nothing about which mechanism issued the call.
_PLUMBING_FILES = ("distributed_c10d.py", "c10d_logger.py")
_PLUMBING_DIRS = tuple(os.path.join(d, "comm") + os.sep for d in (_DEEPSPEED_DIR,) if d)

_FOREIGN_LIBRARY = re.compile(r"[/\\\\](site|dist)-packages[/\\\\](torch|deepspeed)[/\\\\]")
_INDUCTOR_OUTPUT = re.compile(r"[/\\\\]torchinductor_[^/\\\\]+[/\\\\]")
_FOREIGN_DS_COMM = os.sep.join(("", "deepspeed", "comm", ""))

_classified: dict[str, int] = {}
_formatted: dict[tuple[str, int, str], str] = {}


def _classify(filename: str) -> int:
    kind = _classified.get(filename)
    if kind is None:
        real = os.path.realpath(filename) if not filename.startswith("<") else filename
        if real.startswith(_TRACER_PREFIXES):
            kind = _PLUMBING
        elif _INDUCTOR_OUTPUT.search(real):
            kind = _LIBRARY  # code inductor generated: the user's compiled function is the frame above
        elif real.startswith(_LIBRARY_DIRS) or _FOREIGN_LIBRARY.search(real):
            # (paths from another machine's install, as in Flight Recorder dumps, match by pattern)
            plumbing = real.endswith(_PLUMBING_FILES) or (
                (bool(_PLUMBING_DIRS) and real.startswith(_PLUMBING_DIRS)) or _FOREIGN_DS_COMM in real
            )
            kind = _PLUMBING if plumbing else _LIBRARY
        elif filename.startswith("<frozen") or os.sep + "multiprocessing" + os.sep in real:
            kind = _PLUMBING
        else:
            kind = _USER
        _classified[filename] = kind
    return kind


def _short_path(filename: str) -> str:
    for marker in (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep):
        if marker in filename:
            return filename.split(marker, 1)[1]
    # A package installed elsewhere (a --target dir on PYTHONPATH, a checkout): the path from the
    # folder above its top package, so a site reads the same on every machine.
    folder, parts = os.path.dirname(filename), [os.path.basename(filename)]
    while folder and os.path.isfile(os.path.join(folder, "__init__.py")):
        folder, name = os.path.split(folder)
        parts.append(name)
    if len(parts) > 1:
        return "/".join(reversed(parts))
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith(".." + os.sep + "..") else rel


def format_frame(filename: str, lineno: int, function: str) -> str:
    """``path:line function`` with site-packages and cwd prefixes dropped."""
    key = (filename, lineno, function)
    text = _formatted.get(key)
    if text is None:
        text = f"{_short_path(filename)}:{lineno} {function}"
        _formatted[key] = text
    return text


def sites_from_frame(frame: FrameType | None) -> tuple[str, str | None]:
    """(user site, innermost library site or None), walking outward from ``frame``."""
    lib: str | None = None
    f = frame
    while f is not None:
        code = f.f_code
        kind = _classify(code.co_filename)
        if kind == _USER:
            return format_frame(code.co_filename, f.f_lineno, code.co_name), lib
        if kind == _LIBRARY and lib is None:
            lib = format_frame(code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return "<no user frame>", lib


STACK_LIMIT = 64


def sites_and_stack(frame: FrameType | None) -> tuple[str, str | None, list[str]]:
    """(user site, innermost library site, every user frame outward from the site to the outermost).

    The stack keeps the user's frames (up to :data:`STACK_LIMIT`), innermost first, the site
    included: a call inside a helper or a model's ``forward`` still shows the training step and
    the loop line that ran it (reports print it outermost first). A collective issued on a
    thread with no user frame (an autograd device thread running DDP's or FSDP's hooks) takes
    the main thread's user frames: that is where ``backward()`` was called.
    """
    lib, stack = _walk(frame)
    if not stack:
        import threading

        main = sys._current_frames().get(threading.main_thread().ident)
        if main is not None and main is not frame:
            _, stack = _walk(main)
    return (stack[0] if stack else "<no user frame>"), lib, stack


_GRAPH_FILE = "<eval_with_key>"
_TRACE_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _graph_source(frame: FrameType) -> list[tuple[str, int, str]]:
    """The source lines (outermost first) of the graph node a frame of FX-generated code is running.

    ``torch.compile`` runs the user's function as a generated ``forward`` (one line per node); the
    node's ``stack_trace`` holds the user's lines it came from, which the frame itself does not.
    """
    gm = frame.f_locals.get("self")
    lineno_map = getattr(gm, "_lineno_map", None)
    if not lineno_map:
        return []
    idx = lineno_map.get(frame.f_lineno - frame.f_code.co_firstlineno)
    nodes = list(gm.graph.nodes) if idx is not None else []
    trace = nodes[idx].meta.get("stack_trace") if idx is not None and idx < len(nodes) else None
    return [(f, int(n), fn) for f, n, fn in _TRACE_LINE.findall(trace or "")]


def _walk(frame: FrameType | None) -> tuple[str | None, list[str]]:
    lib: str | None = None
    stack: list[str] = []
    compiled: tuple[str, str] | None = None  # the function a graph came from: its frame shows no line
    f = frame
    while f is not None and len(stack) < STACK_LIMIT:
        code = f.f_code
        if code.co_filename.startswith(_GRAPH_FILE):
            source = _graph_source(f)
            for filename, lineno, name in reversed(source):
                kind = _classify(filename)
                if kind == _USER:
                    stack.append(format_frame(filename, lineno, name))
                elif kind == _LIBRARY and lib is None and not stack:
                    lib = format_frame(filename, lineno, name)
            compiled = (source[0][0], source[0][2]) if source else None
            f = f.f_back
            continue
        kind = _classify(code.co_filename)
        if compiled == (code.co_filename, code.co_name):
            kind = _PLUMBING  # the compiled frame itself (at its ``def`` line): the graph named the line
        compiled = None if kind == _USER else compiled
        if kind == _USER:
            stack.append(format_frame(code.co_filename, f.f_lineno, code.co_name))
        elif kind == _LIBRARY and lib is None and not stack:
            lib = format_frame(code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return lib, stack


def current_sites(skip: int = 1) -> tuple[str, str | None]:
    """Call sites of the caller's caller (``skip`` frames above this function)."""
    return sites_from_frame(sys._getframe(skip + 1))


def sites_from_frames(frames: list[tuple[str, int, str]]) -> tuple[str, str | None]:
    """The same rule over an innermost-first list of (file, line, function), e.g. from a FR dump."""
    lib: str | None = None
    for filename, lineno, name in frames:
        kind = _classify(filename)
        if kind == _USER:
            return format_frame(filename, lineno, name), lib
        if kind == _LIBRARY and lib is None:
            lib = format_frame(filename, lineno, name)
    return "<no user frame>", lib
