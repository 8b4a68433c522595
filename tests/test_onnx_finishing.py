"""Finishing runs as onnx_ir passes, each checking the invariant it ensures: the model
``lower`` returns satisfies every one (else the lowering would have raised), and each check
fails on a model that breaks its invariant."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from rewrite.backends.onnx.finishing._passes import (
    Finishing,
    FixOpsets,
    InitializersInFirstUseOrder,
    MergeEqualFunctions,
    MergeScalarVariants,
    OptimizeBodies,
)


@pytest.fixture
def finished(shared_lowered):
    """A copy of a finished model and the state its passes would share."""
    result, lowering = shared_lowered
    model = lowering.model.clone()
    records = lowering.tree.records
    identity = {fid: (records[k].domain, records[k].function_name)
                for k, fid in lowering.outlined.by_group.items() if fid is not None}
    return model, Finishing(identity, lowering.outlined.functions)


def test_the_finished_model_satisfies_every_pass(finished):
    model, state = finished
    assert len(model.functions) >= 2
    for check in (MergeScalarVariants(state), OptimizeBodies(state),
                  MergeEqualFunctions(state, lift_scalars=True), FixOpsets(state, {}),
                  InitializersInFirstUseOrder()):
        check.ensures(model)


def test_a_body_holding_an_initializer_is_not_optimized(finished):
    model, state = finished
    function = next(iter(model.functions.values()))
    value = ir.Value(name="held", const_value=ir.tensor(np.zeros(2, np.float32)))
    function.graph.register_initializer(value)
    with pytest.raises(ir.passes.PostconditionError, match="hold initializers"):
        OptimizeBodies(state).ensures(model)


def test_two_equal_functions_of_one_identity_are_not_merged(finished):
    model, state = finished
    fid, function = next((f, fn) for f, fn in model.functions.items() if f in state.identity)
    copy = ir.Function(function.domain, function.name + "_copy", graph=function.graph.clone(),
                       attributes=())
    model.functions[copy.identifier()] = copy
    state.identity[copy.identifier()] = state.identity[fid]
    with pytest.raises(ir.passes.PostconditionError, match="equal bodies"):
        MergeEqualFunctions(state, lift_scalars=False).ensures(model)


def test_a_call_of_a_merged_function_is_not_retargeted(finished):
    model, state = finished
    call = next(n for n in model.graph if (n.domain, n.op_type, n.overload) in model.functions)
    fid = (call.domain, call.op_type, call.overload)
    state.merged[fid] = ("elsewhere", "Kept", "")
    del model.functions[fid]
    with pytest.raises(ir.passes.PostconditionError, match="which merging removed"):
        MergeScalarVariants(state).ensures(model)


def test_a_function_missing_an_import_is_not_fixed(finished):
    model, state = finished
    fid = state.functions[0]
    model.functions[fid].opset_imports.clear()
    with pytest.raises(ir.passes.PostconditionError, match=f"{fid[0]}::{fid[1]} does not import"):
        FixOpsets(state, {}).ensures(model)


def test_initializers_out_of_first_use_order(finished):
    model, _ = finished
    inits = model.graph.initializers
    assert len(inits) >= 2
    items = list(inits.items())[::-1]
    inits.clear()
    for name, value in items:
        inits[name] = value
    with pytest.raises(ir.passes.PostconditionError, match="first-use order"):
        InitializersInFirstUseOrder().ensures(model)
