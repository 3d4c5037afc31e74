"""`tflms rewrite` / `tflms analyze` on SavedModels: equivalence after a save/load round trip, data safety, errors."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tflms import cli
from tflms.integrations import savedmodel

BATCH = 16


class PlainTrainer(tf.Module):
    """Hand-written variables: ``train`` (input_signature), ``serve`` (inference), ``poly`` (two traces)."""

    def __init__(self):
        super().__init__()
        self.w1 = tf.Variable(tf.random.stateless_normal((8, 16), seed=(1, 2)) * 0.3, name="w1")
        self.w2 = tf.Variable(tf.random.stateless_normal((16, 4), seed=(3, 4)) * 0.3, name="w2")
        self.steps = tf.Variable(0, dtype=tf.int64, name="steps")

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x"),
                                  tf.TensorSpec([None, 4], tf.float32, name="y")])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, self.w1))
            h = tf.nn.relu(tf.matmul(h, tf.eye(16) * 0.5))
            h = tf.nn.relu(tf.matmul(h, tf.eye(16) * 2.0))
            loss = tf.reduce_mean(tf.square(tf.matmul(h, self.w2) - y))
        g1, g2 = tape.gradient(loss, [self.w1, self.w2])
        self.w1.assign_sub(0.01 * g1)
        self.w2.assign_sub(0.01 * g2)
        self.steps.assign_add(1)
        return {"loss": loss}

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(self, x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)

    @tf.function
    def poly(self, x):
        return x * 2.0


class KerasTrainer(tf.Module):
    """A Keras model and optimizer with a custom-loop ``train`` step."""

    def __init__(self):
        super().__init__()
        import keras
        keras.utils.set_random_seed(0)
        self.model = keras.Sequential([keras.Input((8,))] + [keras.layers.Dense(32, activation="relu")
                                                              for _ in range(3)] + [keras.layers.Dense(4)])
        self.optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        self.optimizer.build(self.model.trainable_variables)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.int32, name="y")])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self.model(x, training=True))
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return loss


#: The TFLMS rules at threshold 1: these small steps fit any accelerator, and the default (tuning for its memory)
#: would leave them alone.
RULES = ("--swapout-threshold", 1)


def _inputs(kind: str, batch: int = BATCH, seed: int = 0):
    x = tf.random.stateless_normal((batch, 8), seed=(5, seed))
    if kind == "keras":
        return x, tf.constant(np.arange(batch) % 4, tf.int32)
    return x, tf.random.stateless_normal((batch, 4), seed=(7, seed))


def _save(module, path, **kw):
    tf.saved_model.save(module, str(path), **kw)
    return str(path)


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    module = PlainTrainer()
    module.poly(tf.zeros([2]))
    module.poly(tf.zeros([2, 3]))
    return _save(module, tmp_path_factory.mktemp("plain") / "model",
                 signatures={"serving_default": module.serve, "train": module.train})


@pytest.fixture(scope="module")
def keras_dir(tmp_path_factory):
    return _save(KerasTrainer(), tmp_path_factory.mktemp("keras") / "model")


def _snapshot(root) -> dict[str, str]:
    """Every file under ``root`` with its content hash (to prove nothing was written)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _swap_ops(concrete_function) -> list[str]:
    return sorted(op.name for op in concrete_function.graph.get_operations() if op.name.startswith("lms/"))


@pytest.mark.parametrize("kind", ["plain", "keras"])
def test_loaded_rewrite_trains_bitwise_identically(kind, plain_dir, keras_dir, tmp_path, capsys):
    in_dir = plain_dir if kind == "plain" else keras_dir
    before = _snapshot(in_dir)
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "rewrite", *RULES, in_dir, out_dir, "--batch-size", BATCH, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["output"] == str(out_dir) and doc["input"] == os.path.realpath(in_dir)
    inserted = doc["functions"]["train"][0]["report"]["inserted_ops"]
    assert inserted, "nothing was swapped: the test model should have swappable activations"
    assert _snapshot(in_dir) == before, "the input SavedModel was modified"

    original, rewritten = tf.saved_model.load(in_dir), tf.saved_model.load(str(out_dir))
    (cf,) = rewritten.train.concrete_functions
    assert _swap_ops(cf) == sorted(inserted)
    for step in range(3):
        x, y = _inputs(kind, seed=step)
        a, b = original.train(x, y), rewritten.train(x, y)
        for ta, tb in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
            assert ta.numpy().tobytes() == tb.numpy().tobytes(), f"step {step}: loss differs"
    vars_a, vars_b = savedmodel._variables(original), savedmodel._variables(rewritten)  # noqa: SLF001
    assert sorted(vars_a) == sorted(vars_b) and len(vars_a) >= 3
    for path in vars_a:
        assert vars_a[path].numpy().tobytes() == vars_b[path].numpy().tobytes(), f"variable {path} differs"


def test_other_functions_and_signatures_are_kept_or_follow_the_rewrite(plain_dir, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "rewrite", *RULES, plain_dir, out_dir, "--batch-size", BATCH, "--verify")
    assert code == 0, err
    assert "signatures: serving_default kept, train rewritten (calls train)" in out
    assert "verified:" in out and "kept serve (x: float32[?,8]): no training step" in out
    original, rewritten = tf.saved_model.load(plain_dir), tf.saved_model.load(str(out_dir))
    x, y = _inputs("plain")
    assert np.array_equal(original.serve(x).numpy(), rewritten.serve(x).numpy())
    assert len(rewritten.poly.concrete_functions) == 2
    assert np.array_equal(rewritten.poly(tf.ones([2, 3])).numpy(), np.full((2, 3), 2.0, np.float32))
    served = rewritten.signatures["serving_default"](x=x)["output_0"]
    assert np.array_equal(served.numpy(), original.signatures["serving_default"](x=x)["output_0"].numpy())
    # The train signature runs the rewritten graph: same loss, same updates as the original's signature.
    la = original.signatures["train"](x=x, y=y)["loss"]
    lb = rewritten.signatures["train"](x=x, y=y)["loss"]
    assert la.numpy().tobytes() == lb.numpy().tobytes()
    assert original.w1.numpy().tobytes() == rewritten.w1.numpy().tobytes()


def test_every_traced_signature_is_rewritten(tmp_path, capsys):
    module = PlainTrainer()
    train = tf.function(module.train.python_function)  # no input_signature: one trace per shape
    module.train_any = train
    shapes = (4, 6)
    for batch in shapes:
        train(*_inputs("plain", batch))
    in_dir = _save(module, tmp_path / "in")
    code, out, err = _run(capsys, "rewrite", *RULES, in_dir, tmp_path / "out", "--function", "train_any", "--json")
    assert code == 0, err
    traces = json.loads(out)["functions"]["train_any"]
    assert [t["trace"] for t in traces] == [0, 1] and all(t["report"]["inserted_ops"] for t in traces)
    original, rewritten = tf.saved_model.load(in_dir), tf.saved_model.load(str(tmp_path / "out"))
    assert len(rewritten.train_any.concrete_functions) == 2
    assert all(_swap_ops(cf) for cf in rewritten.train_any.concrete_functions)
    for batch in shapes:
        x, y = _inputs("plain", batch)
        assert original.train_any(x, y)["loss"].numpy().tobytes() == rewritten.train_any(x, y)["loss"].numpy().tobytes()
    assert original.w1.numpy().tobytes() == rewritten.w1.numpy().tobytes()
    with pytest.raises(Exception, match="(?i)could not find matching|no traced signature"):
        rewritten.train_any(*_inputs("plain", 5))  # like the original: traces are all there is


def test_nested_aliased_and_concrete_function_attributes(tmp_path, capsys):
    root = tf.Module()
    root.trainer = PlainTrainer()
    root.alias = root.trainer.train  # one object under two attribute paths
    root.step = root.trainer.train.get_concrete_function()  # a bare ConcreteFunction attribute
    in_dir = _save(root, tmp_path / "in")
    code, out, err = _run(capsys, "rewrite", *RULES, in_dir, tmp_path / "out", "--batch-size", BATCH,
                          "--function", "trainer.train", "--function", "step", "--json")
    assert code == 0, err
    assert sorted(json.loads(out)["functions"]) == ["alias", "step"]  # reported under the shortest path
    original, rewritten = tf.saved_model.load(in_dir), tf.saved_model.load(str(tmp_path / "out"))
    assert rewritten.alias is rewritten.trainer.train
    assert _swap_ops(rewritten.step) and _swap_ops(rewritten.alias.concrete_functions[0])
    x, y = _inputs("plain")
    for model in (original, rewritten):
        model.step(x, y)
        model.trainer.train(x, y)
    assert original.trainer.w2.numpy().tobytes() == rewritten.trainer.w2.numpy().tobytes()
    assert rewritten.trainer.steps.numpy() == 2


def test_analyze_prints_ordering_report_and_memory_and_writes_nothing(plain_dir, capsys):
    parent = os.path.dirname(plain_dir)
    before = sorted(os.listdir(parent)), _snapshot(plain_dir)
    code, out, err = _run(capsys, "analyze", *RULES, plain_dir, "--batch-size", BATCH)
    assert code == 0, err
    assert "train (x: float32[?,8], y: float32[?,4])" in out
    assert "ordering: " in out and " levels; forward " in out
    assert "swapped: " in out and "memory (original, v100-16gb-pcie3): peak " in out
    assert "memory (rewritten, " in out and "alive at the peak" in out
    assert "serve (x: float32[?,8])" in out and "no training step" in out
    code, out, err = _run(capsys, "analyze", *RULES, plain_dir, "--function", "train", "--batch-size", BATCH, "--json")
    assert code == 0, err
    (entry,) = json.loads(out)["functions"]
    assert entry["function"] == "train" and entry["graph"]["categories"]["backward"] > 0
    original, rewritten = entry["memory"]["original"], entry["memory"]["rewritten"]
    assert original["peak_bytes"] > rewritten["peak_bytes"] and original["live_at_peak"]
    assert entry["report"]["swaps"]
    assert (sorted(os.listdir(parent)), _snapshot(plain_dir)) == before


def test_analyze_without_batch_size_refuses_a_verdict_naming_the_flag(plain_dir, capsys):
    code, out, err = _run(capsys, "analyze", plain_dir, "--function", "train")
    assert code == 2 and "--batch-size N" in err and "batch_size=" not in err
    assert "counted as 0" not in out + err


def test_analyze_json_keeps_every_tensor_alive_at_the_peak_and_wide_tables(plain_dir, capsys):
    code, out, err = _run(capsys, "analyze", plain_dir, "--function", "train", "--batch-size", BATCH, "--json")
    assert code == 0, err
    memory = json.loads(out)["functions"][0]["memory"]["original"]
    assert len(memory["live_at_peak"]) == memory["live_at_peak_count"] > 0
    code, out, err = _run(capsys, "analyze", plain_dir, "--function", "train", "--batch-size", BATCH, "--wide")
    assert code == 0, err
    assert f"alive at the peak ({memory['live_at_peak_count']} tensors)" in out
    assert len([line for line in out.splitlines() if line.startswith("      ") and "B  " in line]) \
        >= memory["live_at_peak_count"]
    assert "..." not in out and "hint:" not in out


def test_a_budget_tunes_the_training_function_and_leaves_inference_alone(plain_dir, tmp_path, capsys):
    code, out, err = _run(capsys, "analyze", plain_dir, "--function", "train", "--batch-size", BATCH, "--json")
    assert code == 0, err
    peak = json.loads(out)["functions"][0]["memory"]["original"]["peak_with_margin_bytes"]
    code, out, err = _run(capsys, "rewrite", plain_dir, tmp_path / "out", "--batch-size", BATCH,
                          "--budget", f"{peak - 1}B", "--json")
    assert code == 0, err
    doc = json.loads(out)
    (trace,) = doc["functions"]["train"]
    assert trace["report"]["tuning"]["predicted_peak_bytes"] < peak and trace["report"]["inserted_ops"]
    assert {(s["function"], s["reason"]) for s in doc["skipped"]} == {("poly", "no training step"),
                                                                       ("serve", "no training step")}


# ----------------------------------------------------------------------------------------------- data safety

@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_output_overlapping_the_input_is_refused(where, plain_dir, tmp_path, capsys):
    if where == "contains":  # IN_DIR inside OUT_DIR: a copy of the model one level down
        in_dir = _copy_model(plain_dir, tmp_path / "outer" / "model")
        out_dir, replace = tmp_path / "outer", ["--replace"]
    else:
        in_dir, replace = _copy_model(plain_dir, tmp_path / "model"), []
        out_dir = in_dir if where == "same" else os.path.join(in_dir, "variables", "new")
    before = _snapshot(tmp_path)
    code, _, err = _run(capsys, "rewrite", *RULES, in_dir, out_dir, *replace)
    assert code == 2
    assert {"same": "is IN_DIR", "inside": "is inside IN_DIR", "contains": "is inside OUT_DIR"}[where] in err
    assert _snapshot(tmp_path) == before


def _copy_model(src, dst) -> str:
    import shutil
    shutil.copytree(src, dst)
    return str(dst)


def test_existing_output_needs_replace_and_is_swapped_only_when_complete(plain_dir, tmp_path, capsys):
    out_dir = tmp_path / "out"
    _copy_model(plain_dir, out_dir)
    (out_dir / "marker").write_text("old model")
    code, _, err = _run(capsys, "rewrite", *RULES, plain_dir, out_dir, "--function", "train")
    assert code == 2 and "already exists; pass --replace" in err
    assert (out_dir / "marker").exists()
    # --batch-size: without it only constants have a known size, and grappler folds them before the rewrite
    code, out, err = _run(capsys, "rewrite", *RULES, plain_dir, out_dir, "--function", "train", "--replace",
                          "--batch-size", BATCH)
    assert code == 0, err
    assert "replacing the previous model" in out
    assert not (out_dir / "marker").exists()
    assert sorted(os.listdir(tmp_path)) == ["out"], "a temporary or old directory was left behind"
    assert _swap_ops(tf.saved_model.load(str(out_dir)).train.concrete_functions[0])


def test_replace_refuses_a_directory_that_is_not_a_saved_model(plain_dir, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("precious")
    code, _, err = _run(capsys, "rewrite", *RULES, plain_dir, tmp_path / "out", "--replace")
    assert code == 2 and "is not a SavedModel" in err and "only replaces SavedModel directories" in err
    assert (tmp_path / "out" / "notes.txt").read_text() == "precious"


@pytest.mark.parametrize("replace", [False, True])
def test_a_failed_save_leaves_no_output_and_no_temporary_directory(replace, plain_dir, tmp_path, capsys,
                                                                   monkeypatch):
    out_dir = tmp_path / "out"
    if replace:
        _copy_model(plain_dir, out_dir)
        (out_dir / "marker").write_text("old model")
    before = _snapshot(tmp_path)
    real_save = tf.saved_model.save

    def half_save(obj, export_dir, *args, **kwargs):
        real_save(obj, export_dir, *args, **kwargs)  # write everything, then fail like a full disk would
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", half_save)
    code, _, err = _run(capsys, "rewrite", *RULES, plain_dir, out_dir, "--function", "train", *(["--replace"] if replace
                                                                                           else []))
    assert code == 2 and "saving the rewritten model failed" in err and "No space left" in err
    assert _snapshot(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == (["out"] if replace else [])


def test_a_failed_verification_writes_nothing(plain_dir, tmp_path, capsys, monkeypatch):
    def differs(*args, **kwargs):
        raise savedmodel.SavedModelError("verification failed: variable 'w1' differs; nothing was written")

    monkeypatch.setattr(savedmodel.verify, "verify_equivalence", differs)
    code, _, err = _run(capsys, "rewrite", *RULES, plain_dir, tmp_path / "out", "--function", "train", "--verify")
    assert code == 2 and "verification failed" in err
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------------------------- clear errors

def test_missing_and_non_saved_model_inputs(tmp_path, capsys):
    code, _, err = _run(capsys, "rewrite", tmp_path / "nope", tmp_path / "out")
    assert code == 2 and "nope: no such directory" in err
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "analyze", tmp_path / "empty")
    assert code == 2 and "is not a SavedModel: it has no saved_model.pb" in err
    (tmp_path / "model.keras").write_bytes(b"PK")
    code, _, err = _run(capsys, "rewrite", tmp_path / "model.keras", tmp_path / "out")
    assert code == 2 and "is a file" in err and "Keras" in err
    assert sorted(os.listdir(tmp_path)) == ["empty", "model.keras"]


def test_versioned_export_directory_gets_a_hint(plain_dir, tmp_path, capsys):
    _copy_model(plain_dir, tmp_path / "export" / "1")
    code, _, err = _run(capsys, "analyze", tmp_path / "export")
    assert code == 2 and f"did you mean {tmp_path / 'export' / '1'}?" in err


def test_unknown_function_lists_the_available_ones(plain_dir, tmp_path, capsys):
    code, out, err = _run(capsys, "rewrite", plain_dir, tmp_path / "out", "--function", "trian", "--json")
    assert code == 2
    assert "has no function 'trian'; available: poly, serve, train. Did you mean 'train'?" in err
    assert json.loads(out)["type"] == "SavedModelError"
    code, _, err = _run(capsys, "analyze", plain_dir, "--function", "serving_default")
    assert code == 2 and "'serving_default' is a signature key: it calls the function 'serve'" in err
    assert not (tmp_path / "out").exists()


def test_a_function_without_training_step(plain_dir, tmp_path, capsys):
    code, _, err = _run(capsys, "rewrite", plain_dir, tmp_path / "out", "--function", "serve")
    assert code == 2
    assert "function 'serve'" in err and "has no training step" in err and "leave it out of --function" in err
    serving = tf.Module()
    serving.w = tf.Variable(tf.ones((8, 4)))
    serving.serve = tf.function(lambda x: tf.matmul(x, serving.w), input_signature=[tf.TensorSpec([None, 8])])
    in_dir = _save(serving, tmp_path / "serving")
    code, _, err = _run(capsys, "rewrite", in_dir, tmp_path / "out")
    assert code == 2 and "no function of the SavedModel" in err
    assert "has a training step (tried serve (x: float32[?,8]): no training step)" in err
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def keras_export_dir(tmp_path_factory):
    """A compiled Keras model's ``model.export()`` directory: a ``serve`` endpoint and no training step."""
    import keras
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile("sgd", "mse")
    path = tmp_path_factory.mktemp("keras") / "exported"
    model.export(str(path), verbose=False)
    return path


#: What every refusal of a model.export() directory says: why, and the three ways on.
KERAS_EXPORT_WORDS = ("was written by Keras's model.export()", "inference endpoints (serve)", "no training step",
                      "callbacks=[tflms.keras.LMS()]", "tflms estimate model.keras --batch N", "tf.Module",
                      "input_signature")


@pytest.mark.parametrize("argv", [("rewrite", "{out}"), ("rewrite", "{out}", "--batch-size", BATCH),
                                  ("rewrite", "{out}", "--function", "serve"), ("analyze",), ("plan",),
                                  ("analyze", "--batch-size", BATCH)],
                         ids=["rewrite", "rewrite-sized", "rewrite-serve", "analyze", "plan", "analyze-sized"])
def test_a_keras_export_directory_is_refused_with_what_to_do_instead(keras_export_dir, argv, tmp_path, capsys):
    """Keras's model.export() saves the forward pass in inference mode: no loss, optimizer or gradient, so there is no
    step to rewrite and none can be made. Every command says so first, also without --batch-size (not "give the
    batch size", which would lead nowhere)."""
    command, *rest = argv
    rest = [str(a).format(out=tmp_path / "out") for a in rest]
    code, _, err = _run(capsys, command, keras_export_dir, *rest)
    assert code == 2 and all(w in err for w in KERAS_EXPORT_WORDS), err
    assert "--batch-size N" not in err
    assert not os.path.exists(tmp_path / "out")


def test_a_keras_export_is_recognised_from_its_object_graph(keras_export_dir, plain_dir):
    from tflms.integrations.savedmodel.read import read_saved_model
    assert read_saved_model(keras_export_dir).keras_export and not read_saved_model(plain_dir).keras_export


def test_a_budget_without_unit_is_refused_before_loading(plain_dir, tmp_path, capsys):
    code, _, err = _run(capsys, "rewrite", plain_dir, tmp_path / "out", "--budget", "12")
    assert code == 2 and "has no unit" in err


def test_existing_cli_commands_still_parse():
    parser = cli.build_parser()
    args = parser.parse_args(["demo", "--model", "mlp", "--swapout-threshold", "3"])
    assert args.func is cli.cmd_demo and cli.config_from_args(args).swapout_threshold == 3
    args = parser.parse_args(["rewrite", "in", "out", "--function", "a", "--function", "b.c", "--budget", "1GiB",
                              "--sync-mode", "1"])
    config = cli._savedmodel_config(args)  # noqa: SLF001
    assert args.functions == ["a", "b.c"] and config.budget_bytes == 2**30 and config.sync_mode == 1


def test_plan_command_reports_bound_pool_allocators_and_offsets(keras_dir, capsys):
    assert cli.main(["plan", str(keras_dir), "--function", "train", "--json", "--batch-size", "16",
                     "--swapout-threshold", "2", "--accelerator-device", "/device:GPU:0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (record,) = [f for f in doc["functions"] if f["function"] == "train"]
    for variant in ("original", "rewritten"):
        fig = record[variant]
        assert fig["lower_bound_bytes"] <= fig["planned_pool_bytes"] <= fig["bfc_peak_reserved_bytes"]
        assert fig["offsets"] and all(off % 256 == 0 for off in fig["offsets"].values())
    assert cli.main(["plan", str(keras_dir), "--function", "train", "--batch-size", "16"]) == 0
    assert "BFC allocator model" in capsys.readouterr().out


def test_xla_marks_the_written_function_for_clusters_between_the_copies(plain_dir, tmp_path, capsys):
    """``rewrite --xla`` (issue 47): the written train function carries its XLA clusters, and the loaded model runs
    them with the copies alive between them. ``--verify`` (bit for bit) is refused with it."""
    import collections

    from tflms.testing import record_run_metadata
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "rewrite", *RULES, plain_dir, out_dir, "--batch-size", BATCH, "--xla", "--json")
    assert code == 0, err
    report = json.loads(out)["functions"]["train"][0]["report"]
    clusters, inserted = report["xla_clusters"], report["inserted_ops"]
    assert clusters["kept"] and clusters["clusters"] >= 2 and inserted
    (cf,) = tf.saved_model.load(str(out_dir)).train.concrete_functions
    attrs = {op.name: op.node_def.attr for op in cf.graph.get_operations()}
    assert all(not attrs[n]["_XlaCompile"].b for n in inserted)
    assert sum(1 for a in attrs.values() if "_XlaScope" in a and a["_XlaCompile"].b) >= clusters["clusters"]
    rewritten = tf.saved_model.load(str(out_dir))
    with record_run_metadata() as ran:
        rewritten.train(*_inputs("plain"))
    step = ran.step_graph()  # the loaded signature's function, with the rewritten one inlined (names prefixed)
    ops = collections.Counter(n.op for n in step.post_optimization_graph.node)
    alive = {name for name in inserted for n in step.post_optimization_graph.node if n.name.endswith(name)}
    assert ops["_XlaRun"] >= 2 and alive == set(inserted), (ops, sorted(set(inserted) - alive))
    code, out, err = _run(capsys, "rewrite", *RULES, plain_dir, tmp_path / "v", "--xla", "--verify")
    assert code == 2 and "--verify checks" in err and not (tmp_path / "v").exists()
