"""The sharded learner's shared-memory collectives (``openrft.learner.shared_memory``) against gloo's: three
torchrun ranks (an odd count), float32, float64 and bfloat16, sizes from one element to many chunks of the
buffer. The buffer's file is gone once every rank has mapped it; ``OPENRFT_FSDP_TRANSPORT=gloo`` keeps gloo.
The sharded learner's own tests (tests/core/test_sharded.py) run through it end to end."""

import json

import pytest

from tests.conftest import ROOT
from tests.core.test_sharded import torchrun

pytestmark = pytest.mark.slow
EPSILON = {"torch.float32": 2**-23, "torch.float64": 2**-52, "torch.bfloat16": 2**-7}


def test_shared_memory_collectives_match_gloo_in_every_rank(tmp_path):
    out = tmp_path / "result.json"
    result = torchrun([str(ROOT / "tests" / "core" / "shared_memory_run.py"), str(out)], ranks=3)
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(out.read_text())
    assert found["world"] == 3 and found["gloo_variable_refused"]
    for rank in found["ranks"]:
        assert rank["left"] == []  # the buffer's file was unlinked once mapped
        assert len(rank["errors"]) == 12
        for case, error in rank["errors"].items():
            assert error["gather"] == 0.0, case  # a copy: exact
            # three addends, summed in another order than gloo's: a few units of the last place at most
            assert error["sum"] <= 4 * EPSILON[case.split()[0]] * error["sum_scale"], case
