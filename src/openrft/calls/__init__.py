"""Calls to the outside that rewards and tools both make, owned by neither: remote HTTP endpoints with
retries and a circuit breaker (``endpoints``), the outbound URL policy (``outbound``), the sandbox pool
that runs user code (``sandbox``) and the kinds a call fails with (``failures``)."""
