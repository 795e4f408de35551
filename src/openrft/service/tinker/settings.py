"""The operator's settings of the Tinker API (docs/tinker.md, "Bounds" and "Published models"): how much one
request may ask for, and which base models tenants may name. Set with ``openrft serve`` options
(``cli/tinker_options.py``); kept free of the SDK's imports, so the service's config can hold them."""

from __future__ import annotations

from dataclasses import dataclass, field

OPTIONS = {  # the serve option that sets each bound, named in the refusals
    "max_sequence_tokens": "--tinker-max-sequence-tokens",
    "max_call_tokens": "--tinker-max-call-tokens",
    "max_num_samples": "--tinker-max-num-samples",
    "max_sample_tokens": "--tinker-max-sample-tokens",
    "max_training_clients": "--tinker-max-training-clients",
    "max_sampling_sessions": "--tinker-max-sampling-sessions",
    "clients_per_actor": "--tinker-clients-per-actor",
}


@dataclass
class TinkerSettings:
    # tokens of one sequence: a forward_backward datum's model_input, a sample's prompt plus max_tokens
    max_sequence_tokens: int = 8192
    max_call_tokens: int = 65536  # tokens of one forward_backward / forward call, all its datums together
    max_num_samples: int = 128  # num_samples of one sample request
    max_sample_tokens: int = 131072  # one sample request's num_samples x (prompt + max_tokens)
    # per API key: live training clients (a finished session's are freed) and sampling sessions
    # (create_sampling_client; a training client's snapshot samplers are bounded apart, its newest 16)
    max_training_clients: int = 32
    max_sampling_sessions: int = 32
    # on a Ray cluster (openrft serve --ray-address): training clients and sampling sessions on one node's actor
    clients_per_actor: int = 8
    schedule: str = "fair"  # "fair": each tenant's queue in turn; "fifo": every call in arrival order
    abandon_s: float = 60.0  # a client silent this long (no retrieve, no session heartbeat) is gone: calls dropped
    # the base models tenants may name, besides the bundled openrft-demo: name -> a local directory or a Hub id
    models: dict[str, str] = field(default_factory=dict)
    allow_hub_models: bool = False  # tenants may also name any Hugging Face Hub id (downloaded by the server)

    def bound(self, name: str) -> str:
        """``8192 (--tinker-max-sequence-tokens)``: a bound and how the operator sets it, for a refusal."""
        return f"{getattr(self, name)} ({OPTIONS[name]})"
