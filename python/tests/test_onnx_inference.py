"""aspen.inferenceModel on ONNX files: against onnxruntime, zero-copy inputs and outputs, the combined batch
of deviceIterations and replicas with every output mode, and errors as Python exceptions."""

import numpy as np
import onnxruntime as ort
import pytest

import aspen
from conftest import assert_close, read_onnx_tensor


def ort_run(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@pytest.mark.parametrize("case", ["mlp_ts", "keras_mlp", "block_dynamo"])
def test_matches_onnxruntime(testdata, case):
    d = testdata / "onnx" / case
    sig = aspen._aspen.onnx_signature(str(d / "model.onnx"))
    feeds = {}
    for k, (name, _, _) in enumerate(sig["inputs"]):
        feeds[name] = read_onnx_tensor(d / f"input_{k}.pb")
    model = aspen.inferenceModel(d / "model.onnx")
    out = model(**feeds)
    outs = out if isinstance(out, tuple) else (out,)
    want = ort_run(d / "model.onnx", feeds)
    assert len(outs) == len(want)
    for got, ref in zip(outs, want):
        assert isinstance(got, np.ndarray)
        assert_close(got, ref, atol=1e-4, rtol=1e-4, what=case)
    # a second call runs the same program
    again = model(**feeds)
    np.testing.assert_array_equal(outs[0], (again if isinstance(again, tuple) else (again,))[0])


def test_contiguous_inputs_are_not_copied_and_strided_ones_once(testdata):
    path = testdata / "onnx" / "mlp_ts" / "model.onnx"
    x = read_onnx_tensor(testdata / "onnx" / "mlp_ts" / "input_0.pb")
    model = aspen.inferenceModel(path)
    before = aspen.input_copies()
    y = model(x)
    assert aspen.input_copies() == before
    # The output is a view of aspen's own buffer, not a copy numpy made.
    assert not y.flags.owndata
    assert y.base is not None
    # The same values with other strides: one counted copy, the same result.
    wide = np.zeros((x.shape[0], x.shape[1] * 2), dtype=x.dtype)
    wide[:, ::2] = x
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous
    y2 = model(strided)
    assert aspen.input_copies() == before + 1
    np.testing.assert_array_equal(y, y2)
    # The output outlives the model that made it.
    del model
    assert np.isfinite(y).all()


def test_outputs_are_independent_of_later_calls(testdata):
    path = testdata / "onnx" / "mlp_ts" / "model.onnx"
    x = read_onnx_tensor(testdata / "onnx" / "mlp_ts" / "input_0.pb")
    model = aspen.inferenceModel(path)
    y1 = model(x).copy()
    first = model(x)
    model(x * 2)
    np.testing.assert_array_equal(first, y1)


@pytest.mark.parametrize("mode", ["All", "Final", "Sum", "EveryN"])
def test_device_iterations_and_output_modes(testdata, mode):
    d = testdata / "onnx" / "mlp_ts"
    x = read_onnx_tensor(d / "input_0.pb")  # one micro-batch
    rng = np.random.default_rng(1)
    steps = [x + rng.standard_normal(x.shape).astype(np.float32) for _ in range(4)]
    single = aspen.inferenceModel(d / "model.onnx")
    want = [single(s).copy() for s in steps]
    opts = aspen.Options().deviceIterations(4)
    if mode == "EveryN":
        opts.outputMode(aspen.OutputMode.EveryN, 2)
    else:
        opts.outputMode(getattr(aspen.OutputMode, mode))
    model = aspen.inferenceModel(d / "model.onnx", opts)
    got = model(np.concatenate(steps))
    if mode == "All":
        np.testing.assert_array_equal(got, np.concatenate(want))
    elif mode == "Final":
        np.testing.assert_array_equal(got, want[-1])
    elif mode == "Sum":
        assert_close(got, sum(w.astype(np.float64) for w in want), atol=1e-4, what="sum")
    else:
        np.testing.assert_array_equal(got, np.concatenate([want[1], want[3]]))


def test_replicas_split_the_combined_batch(testdata):
    d = testdata / "onnx" / "mlp_ts"
    x = read_onnx_tensor(d / "input_0.pb")
    single = aspen.inferenceModel(d / "model.onnx")
    a, b = single(x).copy(), single(x * 0.5).copy()
    model = aspen.inferenceModel(d / "model.onnx", aspen.Options().replicationFactor(2).deviceIterations(2))
    y = model(np.concatenate([x, x * 0.5, x * 0.5, x]))
    np.testing.assert_array_equal(y, np.concatenate([a, b, b, a]))


def test_errors_are_python_exceptions_with_aspen_messages(testdata, tmp_path):
    path = testdata / "onnx" / "mlp_ts" / "model.onnx"
    x = read_onnx_tensor(testdata / "onnx" / "mlp_ts" / "input_0.pb")
    with pytest.raises(FileNotFoundError, match="no-such.onnx"):
        aspen.inferenceModel(tmp_path / "no-such.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is no protobuf")
    with pytest.raises(ValueError, match="bad.onnx"):
        aspen.inferenceModel(bad)
    model = aspen.inferenceModel(path)
    with pytest.raises(ValueError, match="expected at most 1 positional"):
        model(x, x)
    with pytest.raises(ValueError, match="input 'nope'"):
        model(nope=x)
    with pytest.raises(ValueError, match="no value for"):
        model()
    model(x)
    with pytest.raises(ValueError, match=r"input 'x': expected f32\[3, 12\], found f32\[5, 12\]"):
        model(np.zeros((5, 12), np.float32))  # the first call fixed the shapes
    with pytest.raises(ValueError, match="expected f32 elements, found i64"):
        model(np.zeros(x.shape, np.int64))
    with pytest.raises(ValueError, match="complex64|float32, float16"):
        model(np.zeros(x.shape, np.complex64))
    with pytest.raises(ValueError, match="multiple of 4"):
        aspen.inferenceModel(path, aspen.Options().deviceIterations(4))(x)
    with pytest.raises(ValueError, match="model: expected an ONNX file path"):
        aspen.inferenceModel(42)
    with pytest.raises(ValueError, match="options: expected an aspen.Options"):
        aspen.inferenceModel(path, {"deviceIterations": 2})
    # still usable after every error
    assert np.isfinite(model(x)).all()


def test_options_are_poptorch_shaped_and_refuse_what_aspen_lacks():
    opts = aspen.Options().deviceIterations(2).replicationFactor(2)
    opts.Training.gradientAccumulation(4)
    opts.Precision.setPartialsType("float32")
    assert (opts.device_iterations, opts.replication_factor, opts.gradient_accumulation) == (2, 2, 4)
    with pytest.raises(AttributeError, match="setAutomaticLoadBalancing: a PopTorch option aspen does not support"):
        opts.setAutomaticLoadBalancing(True)
    with pytest.warns(UserWarning, match="useIpuModel: the IPU Model is a simulated IPU; it has no effect on a CPU"):
        from aspen import options
        options._REPORTED.discard("useIpuModel")
        assert opts.useIpuModel(True) is opts  # an IPU setting: accepted, reported once
    with pytest.raises(AttributeError, match="Training has no option 'setMeanAccumulation'"):
        opts.Training.setMeanAccumulation(True)
    with pytest.raises(ValueError, match=r"deviceIterations: expected an integer in \[1, 2\*\*63 - 1\], found 0"):
        opts.deviceIterations(0)
    with pytest.raises(ValueError, match="outputMode: expected an aspen.OutputMode"):
        opts.outputMode("all")
    with pytest.raises(ValueError, match="setPartialsType: expected float32, float16 or bfloat16"):
        opts.Precision.setPartialsType("int8")
    with pytest.raises(AttributeError, match="set by calling their method"):
        opts.deviceIterations = 3


def test_detach_keeps_the_training_of_an_onnx_file(testdata):
    """detachFromDevice on a training model over an .onnx file once threw the training away (the next call
    started again from the file's weights, with the optimizer's step count kept): it now goes on as if the
    model had stayed on the device."""
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((4, 12)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32))
               for _ in range(6)]
    path = str(testdata / "onnx" / "mlp_ts" / "model.onnx")

    def run(detach_after):
        training = aspen.trainingModel(path, optimizer=aspen.optim.AdamW(None, lr=1e-2), loss="mse")
        losses = []
        for i, (x, y) in enumerate(batches):
            if i == detach_after:
                training.detachFromDevice()
                assert not training.isCompiled()
            losses.append(float(training(x, y)))
        return losses, training.weights()

    want_losses, want_weights = run(None)
    got_losses, got_weights = run(3)
    np.testing.assert_array_equal(got_losses, want_losses)
    assert want_weights.keys() == got_weights.keys()
    for name in want_weights:
        np.testing.assert_array_equal(got_weights[name], want_weights[name], err_msg=name)


def test_an_onnx_file_cut_by_node_names_trains_as_one_device(testdata):
    """Options.setPipelineStages of an ONNX file (models::OnnxImportOptions::stage_begins): stages beginning at
    node-name prefixes, the micro-batches of gradient accumulation flowing through them, train as one device
    accumulating them; a prefix no node has is named."""
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((8, 12)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32))
               for _ in range(4)]
    path = str(testdata / "onnx" / "mlp_ts" / "model.onnx")

    def run(begins=None, schedule="1f1b"):
        opts = aspen.Options()
        opts.Training.gradientAccumulation(4)
        if begins:
            opts.setPipelineStages(begins, schedule=schedule)
        training = aspen.trainingModel(path, opts, optimizer=aspen.optim.SGD(None, lr=0.05, momentum=0.9), loss="mse")
        losses = [float(training(x, y)) for x, y in batches]
        return losses, training.weights(), training._program.pipeline_stages

    want, w_want, one = run()
    assert one == 1
    for begins, schedule in ((["/norm"], "1f1b"), (["/Add", "/fc2"], "gpipe")):
        got, w_got, stages = run(begins, schedule)
        assert stages == len(begins) + 1
        np.testing.assert_allclose(got, want, rtol=1e-6)
        for name in w_want:
            np.testing.assert_allclose(w_got[name], w_want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    with pytest.raises(ValueError, match="/fc3"):
        run(["/fc3"])
    with pytest.raises(ValueError, match="setPipelineStages: schedule: expected '1f1b' or 'gpipe'"):
        aspen.Options().setPipelineStages(["/norm"], schedule="interleaved")
    with pytest.raises(ValueError, match="setPipelineStages: begins: expected a list of str"):
        aspen.Options().setPipelineStages("/norm")


def test_option_values_are_refused_by_the_setter_that_took_them(testdata, tmp_path):
    """Values once taken and failing later (std::bad_cast at the first call, bool("false") taken as True,
    C++ option names in the message, a thread team's core count): each is now refused by the setter, or at
    model creation naming the setters that disagree. numpy's scalars are numbers."""
    opts = aspen.Options()
    assert opts.deviceIterations(np.int64(4)).device_iterations == 4
    cases = [(lambda: opts.recomputation("false"), r"recomputation: expected a bool \(True or False\), found 'false'"),
             (lambda: opts.randomSeed(2 ** 64), r"randomSeed: expected an integer in \[0, 2\*\*64 - 1\], found "
                                                r"18446744073709551616"),
             (lambda: opts.setThreads(2 ** 31), r"setThreads: expected an integer in \[0, \d+\] \(0: every free core; "
                                                r"aspen's core budget is \d+, ASPEN_CORES\), found 2147483648"),
             (lambda: opts.replicationFactor(100000), r"replicationFactor: expected an integer in \[1, \d+\] \(each "
                                                      r"replica takes a core; .*\), found 100000"),
             (lambda: opts.Training.gradientAccumulation(2 ** 70),
              r"Training.gradientAccumulation: expected an integer in \[1, 2\*\*63 - 1\], found "
              r"1180591620717411303424"),
             (lambda: opts.enableExecutableCaching(None), r"enableExecutableCaching: path: expected a str or "
                                                          r"os.PathLike, found None"),
             (lambda: opts.enableProfiling(5), r"enableProfiling: path: expected a str or os.PathLike, found 5"),
             (lambda: opts.Distributed.configureProcessId(-1, 1), r"Distributed.configureProcessId: process_id: "
                                                                  r"expected an integer in \[0, 0\] \(one of "
                                                                  r"num_processes 1\), found -1"),
             (lambda: opts.Distributed.configureProcessId(0, 2.0), r"Distributed.configureProcessId: num_processes: "
                                                                   r"expected an integer in \[1, 2\*\*31 - 1\], "
                                                                   r"found 2.0")]
    for call, message in cases:
        with pytest.raises(ValueError, match="^" + message + "$"):
            call()
    path = testdata / "onnx" / "mlp_ts" / "model.onnx"
    with pytest.raises(ValueError, match=r"^outputMode\(EveryN\) period: expected a divisor of deviceIterations "
                                         r"\(1\), found 5$"):
        aspen.inferenceModel(path, aspen.Options().outputMode(aspen.OutputMode.EveryN, 5))
    half_partials = aspen.inferenceModel(path, aspen.Options().Precision.setPartialsType("f16"))
    with pytest.raises(ValueError, match=r"^Precision.setPartialsType: expected float32 or the compute type "
                                         r"\(float32: Precision.setComputeType, or a half module\), found float16$"):
        half_partials(read_onnx_tensor(testdata / "onnx" / "mlp_ts" / "input_0.pb"))  # checked at compile
    from aspen.options import core_budget
    with pytest.raises(ValueError, match=rf"^setThreads x replicationFactor: expected at most aspen's core budget "
                                         rf"{core_budget()} \(ASPEN_CORES\) in all, found {core_budget()} x 2$"):
        aspen.inferenceModel(path, aspen.Options().setThreads(core_budget()).replicationFactor(2))
    # A setter called after the model was made is checked when it compiles.
    late = aspen.Options()
    model = aspen.inferenceModel(path, late)
    late.outputMode(aspen.OutputMode.EveryN, 3)
    with pytest.raises(ValueError, match=r"^outputMode\(EveryN\) period"):
        model(read_onnx_tensor(testdata / "onnx" / "mlp_ts" / "input_0.pb"))
    assert "every_n" in repr(late)  # repr never raises


def test_inputs_and_losses_are_refused_by_name(testdata):
    """A string or object array once met nanobind's signature dump; a misspelt loss key was ignored, and a
    loss's targets or ignore_index of another type ended in std::bad_cast."""
    path = testdata / "onnx" / "mlp_ts" / "model.onnx"
    model = aspen.inferenceModel(path)
    with pytest.raises(ValueError, match=r"^input 'x': expected a numeric array, found dtype <U1$"):
        model([["a"] * 12] * 3)
    with pytest.raises(ValueError, match=r"^input 'x': expected a numeric array, found dtype object$"):
        model(np.zeros((3, 12), object))
    sgd = aspen.optim.SGD(None, lr=0.1)
    cases = [({"kind": "mse", "ignore_idx": 3}, r"loss\['ignore_idx'\]: expected one of the keys kind, output, "
                                                r"targets, ignore_index, found an unknown key"),
             ({"kind": "mse", "targets": 5}, r"loss\['targets'\]: expected a str, found 5"),
             ({"kind": "mse", "output": None}, r"loss\['output'\]: expected a str, found None"),
             ({"kind": "mse", "ignore_index": 3}, r"loss\['ignore_index'\]: expected only with kind cross_entropy, "
                                                  r"found it with kind mse"),
             ({"kind": "cross_entropy", "ignore_index": "x"}, r"loss\['ignore_index'\]: expected an integer in "
                                                              r"\[-2\*\*31, 2\*\*31 - 1\], found 'x'"),
             ({"kind": "cross_entropy", "ignore_index": 2 ** 70}, r"loss\['ignore_index'\]: expected an integer in "
                                                                  r"\[-2\*\*31, 2\*\*31 - 1\], found "
                                                                  r"1180591620717411303424")]
    for loss, message in cases:
        with pytest.raises(ValueError, match="^" + message + "$"):
            aspen.trainingModel(path, optimizer=sgd, loss=loss)
    with pytest.raises(ValueError, match=r"^optimizer params\[1\]: expected an initializer name of .*model.onnx "
                                         r"\(.*fc1.weight.*\), found 'fc1.wieght'$"):
        aspen.trainingModel(path, optimizer=aspen.optim.SGD(["fc1.bias", "fc1.wieght"], lr=0.1), loss="mse")
    training = aspen.trainingModel(path, optimizer=aspen.optim.AdamW(None), loss="mse")
    with pytest.raises(ValueError, match=r"^setOptimizer: optimizer: expected an aspen.optim optimizer \(SGD, AdamW, "
                                         r"LAMB\) or a torch.optim one \(SGD, Adam, AdamW\), found None$"):
        training.setOptimizer(None)
    optimizer = aspen.optim.AdamW(None)
    optimizer.param_groups[0]["lr"] = float("inf")
    with pytest.raises(ValueError, match=r"^param_groups\[0\]\['lr'\]: expected a finite number >= 0, found inf$"):
        training.setOptimizer(optimizer)
    optimizer.param_groups[0].update(lr=1e-3, weight_decay=0.5)
    with pytest.raises(ValueError, match=r"^param_groups: expected one group with 'lr' alone"):
        training.setOptimizer(optimizer)
    with pytest.raises(ValueError, match=r"^exportOnnx: path: expected a str or os.PathLike, found None$"):
        training(np.zeros((3, 12), np.float32), np.zeros((3, 5), np.float32))
        training.exportOnnx(None)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes_equal_numpy(tmp_path, mode):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    x = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6)
    pads = [0, 2, -1, 0, 3, 2]  # begin per axis, then end; a crop (-1) on the last axis's start
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    inputs = ["x", "pads"]
    if mode == "constant":
        inits.append(numpy_helper.from_array(np.array(-7.5, np.float32), "value"))
        inputs.append("value")
    graph = helper.make_graph([helper.make_node("Pad", inputs, ["y"], mode=mode)], "pad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / f"pad_{mode}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), path)
    got = aspen.inferenceModel(path)(x)
    cropped = x[:, :, 1:]
    width = [(0, 0), (2, 3), (0, 2)]
    want = np.pad(cropped, width, mode=mode, **({"constant_values": -7.5} if mode == "constant" else {}))
    np.testing.assert_array_equal(got, want)


def test_cumsum_and_gather_elements_on_computed_values(tmp_path):
    """RoBERTa's position ids (a cumulative sum of the padding mask) and its token types gathered by them:
    CumSum (every exclusive / reverse form) and GatherElements on values computed from the inputs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    ids = np.array([[5, 9, 1, 1, 7, 2], [1, 3, 3, 8, 1, 1]], np.int64)
    table = np.arange(2 * 10, dtype=np.float32).reshape(2, 10)
    nodes = [helper.make_node("Add", ["ids", "zero"], ["v"])]  # computed, not folded
    outs = []
    for ex in (0, 1):
        for rev in (0, 1):
            nodes.append(helper.make_node("CumSum", ["v", "axis"], [f"c{ex}{rev}"], exclusive=ex, reverse=rev))
            outs.append(f"c{ex}{rev}")
    nodes.append(helper.make_node("Sub", ["v", "three"], ["k"]))  # -2 .. 6: negative indices count from the end
    nodes.append(helper.make_node("GatherElements", ["table", "k"], ["g"], axis=1))
    nodes.append(helper.make_node("GatherElements", ["tablex", "kk"], ["g0"], axis=0))
    outs += ["g", "g0"]
    graph = helper.make_graph(
        nodes, "scan",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, list(ids.shape)),
         helper.make_tensor_value_info("tablex", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT if o.startswith("g") else TensorProto.INT64, None)
         for o in outs],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "axis"),
         numpy_helper.from_array(np.array(3, np.int64), "three"), numpy_helper.from_array(table, "table"),
         numpy_helper.from_array(np.array([[0, 2, 1, 0, 2, 1], [2, 2, 0, 1, 0, 1]], np.int64), "kk")])
    path = tmp_path / "scan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    tablex = np.arange(18, dtype=np.float32).reshape(3, 6) * 0.5
    got = aspen.inferenceModel(path)(ids, tablex)
    ref = ort.InferenceSession(str(path)).run(None, {"ids": ids, "tablex": tablex})
    for name, a, b in zip(outs, got, ref):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("ij->ji", [(3, 4)]),
    ("i,i->", [(6,), (6,)]),
    ("bi,bj->bij", [(2, 3), (2, 4)]),
    ("ijk->j", [(2, 3, 4)]),
    ("abc,cd->bd", [(2, 3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 2)]),
])
def test_einsum_equals_numpy(tmp_path, equation, shapes):
    import onnx
    from onnx import TensorProto, helper
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    names = [f"x{i}" for i in range(len(xs))]
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation)], "einsum",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(x.shape)) for n, x in zip(names, xs)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "einsum.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    got = aspen.inferenceModel(path)(*xs)
    want = np.einsum(equation, *xs)
    np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    assert np.asarray(got).shape == want.shape
