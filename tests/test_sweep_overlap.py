"""Sweep modes of the overlapped executor loop (`--modes baseline,baseline+overlap` on CPU, where a
mode without a suffix runs the serial loop): each runs the serial mode's policy through
Executor(loop=Loop.OVERLAPPED), side by side with it in one trial rotation.
Oracles: the serial twin (the same requests, the same lossless greedy acceptance on the embedded
tiny pair, so the same output tokens) and the row's own per-loop arithmetic."""
import json

import pytest

from dynspec.benchmarks import summary, sweep, sweep_modes, sweep_plan, sweep_run
from dynspec.errors import DynspecError
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.serving.overlap import cache_slack

MODES = "baseline,baseline+overlap,dynamic,dynamic+overlap"
FLAGS = ["--schedule", "2:3", "--acceptance", "real", "--prompts", "stdlib", "--input-len", "8:16",
         "--output-len", "6:12", "--num-requests", "6", "--warmup-requests", "1", "--trials", "2", "--no-progress"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("overlap_sweep") / "s"
    assert sweep.main([*FLAGS, "--concurrency", "1,4", "--modes", MODES, "--out", str(out)]) == 0
    return json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".md").read_text()


def test_overlapped_modes_serve_the_same_tokens_through_the_overlapped_loop(swept):
    doc, _ = swept
    rows = {(r["mode"], r["concurrency"]): r for r in doc["rows"]}
    assert set(rows) == {(m, c) for m in MODES.split(",") for c in (1, 4)}
    for c in (1, 4):
        for m in ("baseline", "dynamic"):
            serial, over = rows[(m, c)], rows[(m + "+overlap", c)]
            assert (serial["loop"], over["loop"]) == ("serial", "overlap")
            assert over["num_requests"] == serial["num_requests"] == 6
            assert over["output_tokens"] == serial["output_tokens"] > 0, (m, c)
            assert serial["overlapped_iterations"] == 0
            assert over["overlapped_iterations"] == over["iterations"] > 0
            assert over["schedule"] == serial["schedule"] and over["draft_sync"] == serial["draft_sync"]
        assert rows[("baseline+overlap", c)]["mean_k"] == 0
        # K=0 rows run the fewest iterations their closed loop allows (prompts fit one step's budget;
        # at C=4 two requests wait for a slot)
        for m in ("baseline", "baseline+overlap"):
            assert sweep_plan.closed_loop_floor(doc["env"], rows[(m, c)]) == rows[(m, c)]["iterations"], (m, c)
        assert sweep_plan.closed_loop_floor(doc["env"], rows[("dynamic", c)]) is None      # drafted: no K=0 bound
        assert rows[("dynamic+overlap", 1)]["mean_k"] == 3            # schedule 2:3 at b=1
    assert doc["env"]["schedules"]["dynamic+overlap"] == doc["env"]["schedules"]["dynamic"] == "2:3"


def test_rows_carry_the_median_trials_per_request_acceptance(swept):
    doc, _ = swept
    for r in doc["rows"]:
        table = r["per_request"]
        assert table["fields"] == ["output_len", "accepted_drafts", "drafted", "decode_steps", "mean_k", "acceptance",
                                   "key"]
        reqs = [dict(zip(table["fields"], q)) for rep in table["replicas"] for q in rep]
        assert len(reqs) == r["num_requests"] and sum(q["output_len"] for q in reqs) == r["output_tokens"]
        drafted = sum(q["drafted"] for q in reqs)
        rate = sum(q["accepted_drafts"] for q in reqs) / drafted if drafted else None
        if r["loop"] == "serial":
            assert rate == r["acceptance_rate"]
        # overlapped: a request's numbers are read when it finishes; the iteration launched for it
        # before its end was known is folded later and counts in the iterations' sums only
        for q in reqs:
            assert 0 <= q["accepted_drafts"] <= q["drafted"] and q["decode_steps"] >= 1
            assert q["mean_k"] == round(q["drafted"] / q["decode_steps"], 4)
            assert q["acceptance"] == (round(q["accepted_drafts"] / q["drafted"], 4) if q["drafted"] else None)
        assert all(q["drafted"] == 0 for q in reqs) == r["mode"].startswith("baseline")


def test_ratios_of_an_overlapped_mode_are_against_its_own_loop(swept):
    doc, md = swept
    rows = {(r["mode"], r["concurrency"]): r for r in doc["rows"]}
    dyn, base = rows[("dynamic+overlap", 4)], rows[("baseline+overlap", 4)]
    assert f"| dynamic+overlap | C=4 | {dyn['output_tok_per_s']:.1f} |" in md
    line = next(x for x in md.splitlines() if x.startswith("| dynamic+overlap | C=4 |"))
    assert line.split(" | ")[4].startswith(f"{dyn['output_tok_per_s'] / base['output_tok_per_s']:.2f}x")
    fig = summary.sweep_figures(doc)
    e = fig["by_concurrency"]["4"]
    assert e["overlap"]["dynamic_vs_baseline"]["of_medians"] == pytest.approx(
        dyn["output_tok_per_s"] / base["output_tok_per_s"])
    assert e["dynamic_vs_baseline"]["of_medians"] == pytest.approx(
        rows[("dynamic", 4)]["output_tok_per_s"] / rows[("baseline", 4)]["output_tok_per_s"])
    assert e["overlap_vs_serial"]["baseline"]["of_medians"] == pytest.approx(
        base["output_tok_per_s"] / rows[("baseline", 4)]["output_tok_per_s"])
    assert e["idle"]["dynamic+overlap"] == dyn["engine_idle_fraction"]
    table = summary.sweep_table(fig)
    assert "overlap: dynamic / max(baseline, static)" in table["header"] and "dynamic+overlap idle" in table["header"]


def test_mode_names_with_the_loop_suffix():
    assert sweep_modes.parse_modes("baseline,static:3+overlap,adaptive+overlap,dynamic+serial") == (
        "baseline", "static:3+overlap", "adaptive+overlap", "dynamic+serial")
    assert [sweep_modes.base_mode(m) for m in ("static:3+overlap", "dynamic")] == ["static:3", "dynamic"]
    s = sweep_modes.mode_schedules(("static:3+overlap", "baseline+overlap"), sweep_modes.DraftSchedule.parse("4:2"), None, 8)
    assert s["static:3+overlap"].draft_len(8) == 3 and s["baseline+overlap"].max_draft_len == 0
    for text, msg in (("baseline+overlap,baseline+overlap", "repeats a mode"),
                      ("turbo+overlap", "unknown mode(s) ['turbo+overlap']"),
                      ("baseline+overlap+overlap", "unknown mode(s)"), ("static:40+overlap", "unknown mode(s)")):
        with pytest.raises(DynspecError) as e:
            sweep_modes.parse_modes(text)
        assert msg in str(e.value)


def test_trtllm_refuses_the_reference_executors_loops(tmp_path, capsys):
    for mode, loop in (("dynamic+overlap", "overlapped"), ("dynamic+serial", "serial")):
        rc = sweep.main(["--engine", "trtllm", "--engine-dir", str(tmp_path), "--modes", f"baseline,{mode}",
                         "--out", str(tmp_path / "x")])
        assert rc == 2
        err = capsys.readouterr().err
        assert f"{mode[7:]} is the reference executor's {loop} loop; --engine trtllm runs its own loop" in err


def test_a_cache_too_short_for_the_overlapped_loop_names_the_length_it_needs(tmp_path, capsys):
    # prompts 8, outputs 6 -> 14 positions; schedule K 3: serial +4 = 18, overlapped +8 = 22
    flags = [*FLAGS[:6], "--input-len", "8", "--output-len", "6", "--concurrency", "1", "--no-progress"]
    assert cache_slack(3, Loop.SERIAL) == 4 and cache_slack(3, Loop.OVERLAPPED) == 8
    rc = sweep.main([*flags, "--modes", "dynamic,dynamic+overlap", "--max-seq-len", "20", "--out", str(tmp_path / "a")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("error: --max-seq-len 20 is too short for the overlapped loop of dynamic+overlap: its"
                            " requests need prompt + output 14 + 8 (2 x (K 3 + 1)) = 22 positions; give"
                            " --max-seq-len 22")
    # cases share one engine of the largest K: case a's overlapped baseline needs K 3's slack from case b
    (tmp_path / "c.json").write_text(json.dumps({"cases": [
        {"name": "a", "args": ["--modes", "baseline+overlap"]}, {"name": "b", "args": ["--modes", "dynamic"]}]}))
    rc = sweep.main([*flags, "--max-seq-len", "20", "--cases", str(tmp_path / "c.json"), "--out", str(tmp_path / "c")])
    assert rc == 2
    assert "error: case 'a': --max-seq-len 20 is too short for the overlapped loop of baseline+overlap" \
        in capsys.readouterr().err
    assert not list(tmp_path.glob("c_*.json"))                   # refused before any engine was opened


def test_varied_over_fixed_per_loop():
    def doc(tps):
        return {"env": {"workload": "w", "command": "c"},
                "rows": [{"mode": m, "concurrency": 64, "output_tok_per_s": t, "trial_tok_per_s": [t]}
                         for m, t in tps.items()]}

    fig = summary.varied_fixed_figures(doc({"baseline": 82.0, "baseline+overlap": 95.0}),
                                       doc({"baseline": 100.0, "baseline+overlap": 100.0}))
    assert fig["by_concurrency"]["64"]["ratio"] == pytest.approx(0.82)
    assert fig["overlap"]["64"]["ratio"] == pytest.approx(0.95)
    assert [r[:2] + r[4:5] + r[7:] for r in summary.varied_fixed_table(fig)["rows"]] == [
        ["serial", "64", "0.820", "-", "-", "-"], ["overlap", "64", "0.950", "-", "-", "-"]]   # no step counts
    # summary.py's worked example: 49586 tokens in 917 steps of 7.10 ms, 49152 in 773 of 7.32
    steps = lambda d, tok, n, ms: {**d, "rows": [{**r, "output_tokens": tok, "iterations": n, "mean_step_ms": ms,
                                                  "mean_decode_rows": 54.1 if n == 917 else 63.5} for r in d["rows"]]}
    fig = summary.varied_fixed_figures(steps(doc({"baseline": 82.0}), 49586, 917, 7.10),
                                       steps(doc({"baseline": 100.0}), 49152, 773, 7.32))
    e = fig["by_concurrency"]["64"]
    assert e["engine_ratio"] == pytest.approx(0.877, abs=5e-4) and e["decode_rows"] == [54.1, 63.5]
    # ... the overlapped rows of the overlap config's workloads (1536 requests drawn, C=64 runs the first 384)
    cmd = ("python -m dynspec.benchmarks.sweep --engine-dir e --concurrency 64,256 --waves 6 --out o"
           " --input-len {} --output-len {}")
    run = lambda d, lens: {"env": {"command": cmd.format(*lens)}, "rows": [{**r, "loop": "overlap", "mean_k": 0.0}
                                                                          for r in d["rows"]]}
    fig = summary.varied_fixed_figures(run(steps(doc({"baseline": 82.0}), 49586, 917, 7.10), ("64:192", "32:224")),
                                       run(steps(doc({"baseline": 100.0}), 49152, 773, 7.32), (128, 128)))
    e = fig["by_concurrency"]["64"]
    assert e["iterations"] == [[917, 917], [773, 773]] and e["floor_rows_ratio"] == pytest.approx(0.850, abs=5e-4)
    assert summary.varied_fixed_table(fig)["rows"][0][8:] == ["917 / 917, 773 / 773", "0.850"]


def test_closed_loop_floor_is_none_where_the_row_has_no_k0_bound_or_its_command_does_not_parse(capsys):
    cmd = "mpirun -n 1 python -m dynspec.benchmarks.sweep --engine-dir e --concurrency 4 --waves 2 --out o"
    row = {"mode": "baseline", "loop": "serial", "concurrency": 4, "replicas": 1, "mean_k": 0.0}
    n = sweep_plan.closed_loop_floor({"command": cmd}, row)
    assert n is not None and n >= 224 / 4                      # 8 requests of 32..224 tokens over 4 slots
    for env, r in (({"command": cmd + " --dataset=d.jsonl"}, row), ({"command": cmd + " --data d.jsonl"}, row),
                   ({"command": cmd + " --no-such-flag"}, row), ({"command": cmd.replace(" --out o", "")}, row),
                   ({"command": cmd, "engine": "trtllm"}, row), ({"command": cmd}, {**row, "mean_k": 1.5}),
                   ({"command": cmd}, {k: v for k, v in row.items() if k != "mean_k"}),
                   ({"command": cmd}, {**row, "replicas": 2}), ({"command": cmd}, {**row, "concurrency": None}),
                   ({"command": "python -m something.else --concurrency 4"}, row)):
        assert sweep_plan.closed_loop_floor(env, r) is None, (env, r)
    assert capsys.readouterr().err == ""                      # a refused command prints no usage text


def test_the_overlap_config_cases_fit_one_engine_of_their_overlapped_loops(tmp_path):
    """benchmarks/configs/overlap.toml: its sweep cases parse as plain sweeps, resolve (here on the
    tiny pair's config: the lengths and modes decide the fit) and every overlapped mode's requests
    fit the shared --max-seq-len at the engine's K; one position less is refused."""
    from dynspec.benchmarks import sweep_cases
    from dynspec.benchmarks.mpi import World
    from dynspec.benchmarks.suite_commands import stage_commands
    from dynspec.benchmarks.suite_config import load_config
    from dynspec.runtime.generate.session import engine_config_for, tiny_pair_dirs

    st = next(s for s in stage_commands(load_config("overlap"), tmp_path / "e", tmp_path / "r") if s.files)
    (path, text), = st.files
    cases = [sweep_cases.Case(c["name"], tuple(c["args"])) for c in json.loads(text)["cases"]]
    argv = [a for a in st.argv[3:] if a not in ("--engine-dir", str(tmp_path / "e"))]
    cfg = engine_config_for(*tiny_pair_dirs(), sweep_modes.DraftSchedule.parse("24:3,179:1"))

    def plans(extra=()):
        runs = [sweep_cases.parse_case([*argv, *extra], c, st.out) for c in cases]
        return [sweep_run.PlannedSweep(r, cfg, "tiny", sweep_plan.resolve(r.args, World(0, 1, 0), cfg)) for r in runs]

    got = plans()
    assert [p.case.name for p in got] == ["varied", "fixed", "regime_b"]
    assert all(set(dict(p.spec.loops).values()) == {Loop.SERIAL, Loop.OVERLAPPED} for p in got)   # both loops named
    assert sweep_cases.engine_sizes([p.spec for p in got])["max_draft_len"] == 7
    sweep_run.check_engine_overlap(got)
    need = max(r.input_len + r.output_tokens for p in got for r in p.spec.requests) + cache_slack(7, Loop.OVERLAPPED)
    assert need <= 432 == 192 + 224 + cache_slack(7, Loop.OVERLAPPED)           # the lengths' bound, 416 + 16
    with pytest.raises(DynspecError, match=f"--max-seq-len {need - 1} is too short .* give --max-seq-len {need}$"):
        sweep_run.check_engine_overlap(plans(["--max-seq-len", str(need - 1)]))
