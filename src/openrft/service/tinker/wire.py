"""The Tinker SDK's protobuf messages (the SDK's own ``tinker.proto`` module): forward_backward requests
read, ForwardBackwardOutput and SampleResponse written. Everything else the SDK sends is JSON."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tinker.proto import tinker_public_pb2 as pb


class WireError(ValueError):
    """A request body the server cannot read; the message names the field."""


_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class WireDatum:
    tokens: list[int]
    inputs: dict[str, torch.Tensor]


@dataclass
class WireForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def _tensor(msg: pb.Tensor, where: str) -> torch.Tensor:
    dtype = _NUMPY.get(msg.dtype)
    if dtype is None:
        raise WireError(f"{where} has dtype {msg.dtype}; float32 and int64 are supported")
    shape = list(msg.shape)
    if msg.HasField("sparse_csr"):
        values = np.frombuffer(msg.sparse_csr.values, dtype=dtype)
        crow = np.frombuffer(msg.sparse_csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(msg.sparse_csr.col_indices, dtype=np.int64)
        if len(shape) != 2:
            raise WireError(f"{where} is sparse with shape {shape}; a sparse tensor must have two dimensions")
        dense = np.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            dense[row, col[crow[row] : crow[row + 1]]] = values[crow[row] : crow[row + 1]]
        array = dense
    else:
        array = np.frombuffer(msg.dense, dtype=dtype).copy()
        if shape:
            if int(np.prod(shape)) != array.size:
                raise WireError(f"{where} has {array.size} values but shape {shape}")
            array = array.reshape(shape)
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.long() if tensor.dtype in (torch.int32, torch.int64) else tensor.float()


def read_forward_backward(body: bytes) -> WireForwardBackward:
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError
        raise WireError(f"the forward_backward body is not a ForwardBackwardRequest message: {exc}") from None
    config: dict[str, float | str] = {}
    for key, value in msg.loss_fn_config.items():
        config[key] = float(value)
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for i, datum in enumerate(msg.data):
        tokens: list[int] = []
        for j, chunk in enumerate(datum.model_input):
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise WireError(f"data[{i}].model_input.chunks[{j}] is an image or audio chunk; only tokens are served")
            tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
        inputs = {name: _tensor(t, f"data[{i}].loss_fn_inputs.{name}") for name, t in datum.loss_fn_inputs.items()}
        data.append(WireDatum(tokens, inputs))
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
