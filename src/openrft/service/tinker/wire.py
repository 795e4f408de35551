"""The Tinker SDK's protobuf messages (the SDK's own ``tinker.proto`` module): forward_backward requests
read, ForwardBackwardOutput and SampleResponse written. Everything else the SDK sends is JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tinker.proto import tinker_public_pb2 as pb

from openrft.service.tinker.settings import TinkerSettings
from openrft.service.tinker.stability import Span, spans_of


class WireError(ValueError):
    """A request body the server cannot read; the message names the field. ``status`` 413: past a bound."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class WireDatum:
    tokens: list[int]
    inputs: dict[str, torch.Tensor]
    spans: list[Span] | None = None  # loss_fn_input_spans: the sampled sequence behind each target (stability.py)


@dataclass
class WireForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def _values(raw: bytes, dtype, where: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise WireError(f"{where} holds {len(raw)} bytes, not a whole number of {np.dtype(dtype).name} values")
    return np.frombuffer(raw, dtype=dtype)


def _tensor(msg: pb.Tensor, where: str, most: int, settings: TinkerSettings) -> torch.Tensor:
    """The tensor, after its declared shape is checked against the values the body carries and against
    ``most`` values (a loss input holds one value per token of its datum): nothing is allocated for a
    declared shape the body does not carry or the bound does not allow."""
    dtype = _NUMPY.get(msg.dtype)
    if dtype is None:
        raise WireError(f"{where} has dtype {msg.dtype}; float32, int32 and int64 are supported")
    shape = list(msg.shape)
    if len(shape) > 2 or any(d < 0 for d in shape):
        raise WireError(f"{where} has shape {shape}; a loss input has one or two dimensions, none negative")
    declared = math.prod(shape) if shape else None  # exact: Python ints never overflow
    if declared is not None and declared > most:
        raise WireError(
            f"{where} declares shape {shape} ({declared} values); a loss input holds one value per token of its "
            f"datum, at most {settings.bound('max_sequence_tokens')} tokens",
            413,
        )
    if msg.HasField("sparse_csr"):
        if len(shape) != 2:
            raise WireError(f"{where} is sparse with shape {shape}; a sparse tensor must have two dimensions")
        values = _values(msg.sparse_csr.values, dtype, f"{where}.sparse_csr.values")
        crow = _values(msg.sparse_csr.crow_indices, np.int64, f"{where}.sparse_csr.crow_indices")
        col = _values(msg.sparse_csr.col_indices, np.int64, f"{where}.sparse_csr.col_indices")
        rows, cols = shape
        if len(crow) != rows + 1 or crow[0] != 0 or bool((np.diff(crow) < 0).any()):
            raise WireError(
                f"{where}.sparse_csr.crow_indices must be {rows + 1} non-decreasing row offsets from 0, got {len(crow)}"
            )
        if not len(values) == len(col) == int(crow[-1]):
            raise WireError(
                f"{where}.sparse_csr has {len(values)} values and {len(col)} column indices; crow_indices "
                f"ends at {int(crow[-1])}: the three must agree"
            )
        if len(col) and (int(col.min()) < 0 or int(col.max()) >= cols):
            raise WireError(f"{where}.sparse_csr.col_indices holds a column outside [0, {cols})")
        array = np.zeros(shape, dtype=dtype)  # within the bound: at most ``most`` values
        row_of = np.repeat(np.arange(rows), np.diff(crow))
        array[row_of, col] = values
    else:
        array = _values(msg.dense, dtype, f"{where}.dense")
        if array.size > most:
            raise WireError(
                f"{where} holds {array.size} values; a loss input holds one value per token of its datum, "
                f"at most {settings.bound('max_sequence_tokens')} tokens",
                413,
            )
        array = array.copy()
        if shape:
            if declared != array.size:
                raise WireError(f"{where} has {array.size} values but shape {shape}")
            array = array.reshape(shape)
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.long() if tensor.dtype in (torch.int32, torch.int64) else tensor.float()


def read_forward_backward(body: bytes, settings: TinkerSettings) -> WireForwardBackward:
    """The request, read within the operator's bounds (``settings``): tokens per datum and per call, and no
    tensor larger than its datum could use."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception:  # protobuf's DecodeError, whose text names the library's internals
        raise WireError("the forward_backward body is not a ForwardBackwardRequest protobuf message") from None
    config: dict[str, float | str] = {}
    for key, value in msg.loss_fn_config.items():
        config[key] = float(value)
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    total = 0
    most = settings.max_sequence_tokens
    for i, datum in enumerate(msg.data):
        tokens: list[int] = []
        for j, chunk in enumerate(datum.model_input):
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise WireError(f"data[{i}].model_input.chunks[{j}] is an image or audio chunk; only tokens are served")
            raw = chunk.encoded_text.tokens
            if len(tokens) + len(raw) // 4 > most:
                raise WireError(
                    f"data[{i}].model_input has more than {settings.bound('max_sequence_tokens')} tokens, "
                    "the most one datum may hold",
                    413,
                )
            tokens += _values(raw, np.int32, f"data[{i}].model_input.chunks[{j}].tokens").tolist()
        total += len(tokens)
        if total > settings.max_call_tokens:
            raise WireError(
                f"data holds more than {settings.bound('max_call_tokens')} tokens, the most one call may hold: "
                "split the batch into several forward_backward calls before one optim_step",
                413,
            )
        if not tokens:
            raise WireError(f"data[{i}].model_input is empty")
        inputs = {
            name: _tensor(t, f"data[{i}].loss_fn_inputs.{name}", most, settings)
            for name, t in datum.loss_fn_inputs.items()
        }
        data.append(WireDatum(tokens, inputs, spans_of(datum)))
    return WireForwardBackward(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)


def forward_backward_output(per_datum: dict[str, list[torch.Tensor]], metrics: dict[str, float]) -> bytes:
    """One ArrayRecord holding each named float32 output of every datum (ragged, by byte offsets)."""
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    count = len(next(iter(per_datum.values()), []))
    record = out.loss_fn_outputs.add(num_datums=count)
    for name, tensors in per_datum.items():
        arrays = [t.detach().float().cpu().numpy().astype(np.float32).reshape(-1) for t in tensors]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        field = record.fields[name]
        field.data = b"".join(a.tobytes() for a in arrays)
        field.offsets = offsets.tobytes()
        field.dtype = pb.DTYPE_FLOAT32
    return out.SerializeToString()


@dataclass
class WireSequence:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool


def sample_response(sequences: list[WireSequence], prompt_logprobs: list[float] | None) -> bytes:
    out = pb.SampleResponse()
    for seq in sequences:
        item = out.sequences.add()
        item.stop_reason = pb.STOP_REASON_STOP if seq.stopped else pb.STOP_REASON_LENGTH
        item.tokens = np.asarray(seq.tokens, dtype=np.int32).tobytes()
        item.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return out.SerializeToString()
