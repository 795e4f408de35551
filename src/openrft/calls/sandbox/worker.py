"""The sandboxed worker: runs user functions on request. Standard library only, no openrft imports.

It is started inside the sandbox (``mechanism.py``) as ``python -I -S worker.py CONFIG_JSON`` and
speaks length-prefixed JSON frames (4-byte big-endian length) on its original stdout/stdin.
User code's own prints go to stderr, never into the protocol.

Request:  ``{"source", "entry", "args", "content_args", "script"}`` (a source is compiled once and kept
          by its hash; the arguments at the ``content_args`` positions are Vertex Content objects,
          passed as ``VertexContent``; with ``script: {names, extra, result}`` the source is a script
          run per call, see ``_run_script``), or ``{"check": true, "source", "entry"}`` to only load it.
Answer:   ``{"ok": true, "value": ..., "stdout": ...}`` or ``{"ok": false, "kind", "message", "stdout"}``;
          ``stdout`` is what the call printed (at most 64 KiB), kept apart from the protocol.
After a MemoryError the worker answers and exits: its heap is not trusted any more.
"""

import hashlib
import io
import json
import os
import resource
import struct
import sys
import traceback

_FUNCTIONS = {}
STDOUT_LIMIT = 64 * 1024


class VertexContent(str):
    """Vertex's ``response`` argument: a Content object ``{"role": "model", "parts": [{"text": ...}]}``
    (the REST reference's shape: ``response.get("parts")[0]["text"]``, ``response["parts"]``) that is
    also the parsed text itself, so snippets written against the text (``response == "391"``,
    ``len(response)``, ``response.strip()``) keep working. ``in`` is true for a Content key or a
    substring of the text."""

    def __new__(cls, content):
        parts = content.get("parts") or []
        text = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
        obj = super().__new__(cls, text)
        obj.content = content
        return obj

    def get(self, key, default=None):
        return self.content.get(key, default)

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.content[key]
        return str.__getitem__(self, key)

    def __contains__(self, item):
        return item in self.content or str.__contains__(self, item)

    def keys(self):
        return self.content.keys()

    def values(self):
        return self.content.values()

    def items(self):
        return self.content.items()

    def to_dict(self):
        return self.content


def _limit(config):
    memory = config["memory_limit_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = config["file_size_limit_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def _read(stream):
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return json.loads(stream.read(size).decode("utf-8"))


def _write(stream, message):
    try:
        data = json.dumps(message, allow_nan=True).encode("utf-8")
    except (TypeError, ValueError) as exc:
        data = json.dumps(
            {"ok": False, "kind": "invalid_output", "message": f"the function returned a value that is not JSON: {exc}"}
        ).encode("utf-8")
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _load(source, entry):
    key = hashlib.sha256((entry + "\0" + source).encode("utf-8")).hexdigest()
    if key not in _FUNCTIONS:
        namespace = {"__name__": "user_code"}
        exec(compile(source, "<user code>", "exec"), namespace)  # the sandbox is what makes this safe
        function = namespace.get(entry)
        if not callable(function):
            raise LookupError(f"the code defines no function {entry}()")
        _FUNCTIONS[key] = function
    return _FUNCTIONS[key]


_SCRIPTS = {}


def _run_script(source, args, script):
    """A snippet without a function: run it as a script with ``args`` bound to ``script["names"]`` (and the
    ``script["extra"]`` globals); the value it leaves in ``script["result"]`` is the answer."""
    key = hashlib.sha256(source.encode("utf-8")).hexdigest()
    if key not in _SCRIPTS:
        _SCRIPTS[key] = compile(source, "<user code>", "exec")
    namespace = {"__name__": "user_code", **dict(zip(script["names"], args)), **script.get("extra", {})}
    exec(_SCRIPTS[key], namespace)  # the sandbox is what makes this safe
    if script["result"] not in namespace:
        raise LookupError(f"the snippet defines no function and sets no {script['result']}")
    return namespace[script["result"]]


def _error(kind, exc):
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    user = [line for line in lines if "<user code>" in line or not line.startswith("  File")]
    return {"ok": False, "kind": kind, "message": "".join(user[-6:]).strip()[-2000:]}


def main():
    config = json.loads(sys.argv[1])
    for path in config.get("paths", []):
        sys.path.append(path)
    protocol_out = os.fdopen(os.dup(1), "wb")
    protocol_in = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdout = sys.stderr
    _limit(config)
    _write(protocol_out, {"ok": True, "value": "ready"})
    while True:
        request = _read(protocol_in)
        if request is None:
            return
        printed = ""
        try:
            script = request.get("script")
            function = None if script else _load(request["source"], request["entry"])
            if request.get("check"):
                answer = {"ok": True, "value": None}
            else:
                args = request["args"]
                for i in request.get("content_args") or ():
                    args[i] = VertexContent(args[i])
                captured = io.StringIO()
                sys.stdout = captured
                try:
                    value = function(*args) if function else _run_script(request["source"], args, script)
                finally:
                    sys.stdout = sys.stderr
                    printed = captured.getvalue()
                answer = {"ok": True, "value": value}
        except MemoryError:
            _FUNCTIONS.clear()
            _write(
                protocol_out,
                {
                    "ok": False,
                    "kind": "runtime_error",
                    "message": f"MemoryError: the code went past the memory limit ({config['memory_limit_mb']} MB)",
                },
            )
            os._exit(3)
        except SyntaxError as exc:
            answer = {"ok": False, "kind": "runtime_error", "message": f"SyntaxError: {exc}"}
        except BaseException as exc:  # user code may raise SystemExit or KeyboardInterrupt too
            answer = _error("runtime_error", exc)
        if printed:
            answer["stdout"] = printed[:STDOUT_LIMIT]
        _write(protocol_out, answer)


if __name__ == "__main__":
    main()
