"""What `spade update` asks of DeepSpeed, checked without it (it needs a GPU): the gradient clip is
--max-grad-norm, not accelerate's 1.0, and a KL reference under ZeRO-3 is refused clearly."""

from __future__ import annotations

import pytest

from spade_cli.core.artifacts import SpadeError
from spade_cli.training import policy as update_model

pytestmark = pytest.mark.unit


def test_deepspeed_clips_at_max_grad_norm() -> None:
    config = {"gradient_clipping": "auto", "zero_optimization": {"stage": 2}}  # accelerate's plugin default
    update_model.deepspeed_clip(config, 0.3)
    assert config["gradient_clipping"] == 0.3
    config = {}
    update_model.deepspeed_clip(config, 0.0)  # --max-grad-norm 0: off, which DeepSpeed spells 0
    assert config["gradient_clipping"] == 0.0
    config = {"gradient_clipping": 0.3}
    update_model.deepspeed_clip(config, 0.3)  # a config file that agrees
    with pytest.raises(SpadeError, match="the DeepSpeed config sets gradient_clipping 1.0 but --max-grad-norm is 0.5"):
        update_model.deepspeed_clip({"gradient_clipping": 1.0}, 0.5)


def test_a_kl_reference_is_refused_under_zero3_only() -> None:
    for stage in (None, 0, 1, 2):
        update_model.check_reference_backend(stage)
    with pytest.raises(SpadeError, match="not supported under ZeRO-3"):
        update_model.check_reference_backend(3)
