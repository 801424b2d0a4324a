"""The zoo's BERT encoder and GPT-2 blocks exported with dynamic batch and sequence axes (`batch="batch",
seq="sequence"`, as torch.onnx.export writes `dynamic_axes`): imported with both dims symbolic, compiled once,
and run at batch 1, 3, 8 x sequence 1, 17, 128, 384 against onnxruntime, with no compilation after the build.

Every graph input is fed at run time, as onnxruntime is fed. The real sizes (hidden 768, 12 heads) run under
the `models` mark (`make test-models`); `make test` runs the same grid on the zoo's small sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from kiln import relay  # noqa: E402
from kiln.relay.backend import te_compiler  # noqa: E402
from kiln.relay.frontend import from_onnx  # noqa: E402
from kiln.runtime import ExecutorError  # noqa: E402
from kiln.testing import zoo  # noqa: E402

GRID = [(b, s) for b in (1, 3, 8) for s in (1, 17, 128, 384)]
DYNAMIC = {"batch": "batch", "seq": "sequence"}


def _dynamic(name: str, small: bool) -> Any:
    return zoo.build(name, small=small, **DYNAMIC)


def _build(model: Any) -> Any:
    mod, params = from_onnx(model)
    return relay.build(mod, params=params)


def _grid_matches_onnxruntime(name: str, small: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _dynamic(name, small)
    mod, params = from_onnx(model)
    first = mod["main"].params[0].checked_type
    assert [str(d) for d in first.shape[:2]] == ["batch", "sequence"]
    lib = relay.build(mod, params=params)
    kernels = len(lib.kernels)
    monkeypatch.setattr(te_compiler, "compile_primitive", lambda *a, **k: pytest.fail("compiled at run time"))
    ex = lib.create_executor()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, seq in GRID:
        feed = zoo.inputs(model, seed=batch * 1000 + seq, sizes={"batch": batch, "sequence": seq})
        got, (want,) = ex(**feed), session.run(None, feed)
        assert got.shape == want.shape == (batch, seq, model.graph.output[0].type.tensor_type.shape.dim[2].dim_value)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} at batch {batch}, seq {seq}")
    assert len(lib.kernels) == kernels and all(launch.kernel < kernels for launch in lib.graph.launches)


@pytest.mark.parametrize("name", ["bert_base", "gpt2_blocks"])
def test_small_transformer_compiled_once_runs_every_batch_and_length(name: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _grid_matches_onnxruntime(name, True, monkeypatch)


@pytest.mark.models
@pytest.mark.parametrize("name", ["bert_base", "gpt2_blocks"])
def test_real_size_transformer_compiled_once_runs_every_batch_and_length(name: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _grid_matches_onnxruntime(name, False, monkeypatch)


def test_a_sequence_past_the_position_table_is_refused_and_the_executor_goes_on() -> None:
    """BERT slices its 512 position ids to the sequence length; GPT-2 its 1024x1024 causal mask. The executor
    checks that before it plans or runs anything for the new sizes."""
    for name, table in [("bert_base", 512), ("gpt2_blocks", 1024)]:
        model = _dynamic(name, True)
        lib = _build(model)
        assert any(large == table for _, large, _ in lib.graph.checks)
        ex = lib.create_executor()
        longest = zoo.inputs(model, sizes={"batch": 1, "sequence": table})
        want = ex(**longest)
        feed = zoo.inputs(model, sizes={"batch": 2, "sequence": table + 1})
        with pytest.raises(ExecutorError, match=rf"strided_slice \(at /Slice_\d+\): the slice \[0:sequence\] of axis "
                                                rf"\d, of size {table} needs sequence <= {table}, which the sizes "
                                                rf"sequence = {table + 1} break \(.*sequence from input "
                                                r"\w+\.shape\[1\]"):
            ex(**feed)
        np.testing.assert_array_equal(ex(**longest), want)
