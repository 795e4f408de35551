"""The sandboxed worker: runs user functions on request. Standard library only, no openrft imports.

It is started inside the sandbox (``mechanism.py``) as ``python -I -S worker.py CONFIG_JSON`` and
speaks length-prefixed JSON frames (4-byte big-endian length) on its original stdout/stdin.
User code's own prints go to stderr, never into the protocol.

Request:  ``{"source", "entry", "args"}`` (a source is compiled once and kept by its hash), or
          ``{"check": true, "source", "entry"}`` to only load it.
Answer:   ``{"ok": true, "value": ...}`` or ``{"ok": false, "kind", "message"}``.
After a MemoryError the worker answers and exits: its heap is not trusted any more.
"""

import hashlib
import json
import os
import resource
import struct
import sys
import traceback

_FUNCTIONS = {}


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
        try:
            function = _load(request["source"], request["entry"])
            if request.get("check"):
                answer = {"ok": True, "value": None}
            else:
                answer = {"ok": True, "value": function(*request["args"])}
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
        _write(protocol_out, answer)


if __name__ == "__main__":
    main()
