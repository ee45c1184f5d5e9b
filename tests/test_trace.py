"""Timelines (``jaxmesh.trace``): Trace Event Format JSON that Perfetto reads.

``check_trace_events`` states the format's rules for the event kinds we write
(the JSON object form of the Trace Event Format, as Perfetto's and
chrome://tracing's JSON importers read it): a ``traceEvents`` list; every
event a name, a phase, integer pid and tid; complete events (``X``) a
non-negative ``ts`` and ``dur`` in microseconds; instants (``i``) a scope;
metadata (``M``) a known name with its args.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmesh
from jaxmesh.remote.server import EnvServer
from jaxmesh.trace import Trace, check_trace_path

PHASES = {"X", "i", "M"}
META = {
    "process_name": "name",
    "thread_name": "name",
    "thread_sort_index": "sort_index",
}


def check_trace_events(doc: dict) -> list[dict]:
    """Asserts the Trace Event Format rules; returns the non-metadata events."""
    assert set(doc) >= {"traceEvents"}
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = doc["traceEvents"]
    assert isinstance(events, list)
    spans = []
    for e in events:
        assert isinstance(e["name"], str) and e["name"]
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in META and META[e["name"]] in e["args"], e
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0, e
        assert isinstance(e.get("cat", ""), str)
        if e["ph"] == "X":
            assert isinstance(e["dur"], int | float) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
        if "args" in e:
            assert isinstance(e["args"], dict)
        spans.append(e)
    ts = [e["ts"] for e in spans]
    assert ts == sorted(ts)
    named = {e["tid"] for e in events if e["name"] == "thread_name"}
    assert {e["tid"] for e in spans} <= named  # every row has a name
    return spans


def test_spans_rows_and_args_as_trace_event_format(tmp_path):
    trace = Trace()
    t0 = trace.start
    trace.add("plan", t0 + 0.001, t0 + 0.0015, "group 0", {"lanes": 3})
    trace.add("compile", t0, t0 + 0.002)
    with trace.span("segment", "run", steps=128):
        time.sleep(0.001)
    trace.instant("episode 0 ends", t0 + 0.0012, "run")
    path = trace.write(tmp_path / "sub" / "run.trace.json", {"num_envs": 3})
    doc = json.loads(path.read_text())
    spans = check_trace_events(doc)
    by_name = {e["name"]: e for e in spans}
    # Times in microseconds from the trace's start.
    assert by_name["compile"]["ts"] == 0 and by_name["compile"]["dur"] == 2000
    assert by_name["plan"]["ts"] == 1000 and by_name["plan"]["dur"] == 500
    assert by_name["plan"]["args"] == {"lanes": 3}
    assert by_name["segment"]["dur"] >= 1000
    assert by_name["segment"]["args"] == {"steps": 128}
    rows = {
        e["tid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["name"] == "thread_name"
    }
    assert rows[by_name["plan"]["tid"]] == "group 0"
    assert rows[by_name["compile"]["tid"]] == "run"
    assert doc["otherData"]["settings"] == {"num_envs": 3}
    assert doc["otherData"]["dropped_events"] == 0


def test_a_span_is_kept_when_its_block_raises():
    trace = Trace()
    with pytest.raises(RuntimeError), trace.span("segment"):
        raise RuntimeError("boom")
    assert [e["name"] for e in trace.events] == ["segment"]


def test_events_past_the_cap_are_counted_not_kept():
    trace = Trace(max_events=3)
    for i in range(5):
        trace.add(f"call {i}", trace.start, trace.start + 1e-3)
    doc = trace.to_json()
    assert len(check_trace_events(doc)) == 3
    assert doc["otherData"] == {"events": 3, "dropped_events": 2}
    with pytest.raises(ValueError, match="max_events=0"):
        Trace(max_events=0)


def test_secret_settings_are_redacted_and_their_text_taken_out(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMESH_TOKEN", "env-token-0042")
    trace = Trace()
    # A secret that strays into another string (an event's args, a setting's
    # value) is taken out there too.
    t = trace.start
    trace.add("call", t, t, "group 0", {"note": "sent tok-abc123 to the server"})
    trace.add("call", t, t, "group 0", {"note": "env-token-0042 from the env"})
    settings = {
        "token": "tok-abc123",
        "credentials": "ChannelCredentials",
        "tls_key": None,
        "env": "grpc://127.0.0.1:5555",
        "label": "run with tok-abc123",
        "num_envs": 4,
    }
    text = trace.write(tmp_path / "t.json", settings).read_text()
    assert "tok-abc123" not in text and "env-token-0042" not in text
    doc = json.loads(text)
    assert doc["otherData"]["settings"] == {
        "token": "***",
        "credentials": "***",
        "tls_key": None,  # not given: shown as not given
        "env": "grpc://127.0.0.1:5555",
        "label": "run with ***",
        "num_envs": 4,
    }
    notes = [e["args"]["note"] for e in check_trace_events(doc)]
    assert notes == ["sent *** to the server", "*** from the env"]


def test_trace_path_is_checked_before_a_run(tmp_path):
    assert check_trace_path(None) is None
    assert check_trace_path(tmp_path / "a.json") == tmp_path / "a.json"
    with pytest.raises(TypeError, match="trace=3"):
        check_trace_path(3)
    with pytest.raises(ValueError, match="does not exist"):
        check_trace_path(tmp_path / "missing" / "a.json")


# Runs ----------------------------------------------------------------------------
def spans_of(path) -> tuple[list[dict], dict[int, str]]:
    doc = json.loads(path.read_text())
    spans = check_trace_events(doc)
    rows = {
        e["tid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["name"] == "thread_name"
    }
    return spans, rows


def names_on(spans, rows, row: str) -> list[str]:
    return [e["name"] for e in spans if rows[e["tid"]] == row]


def lean(obs):
    return (obs[2] > 0).astype(jnp.int32)


def test_a_jax_run_traces_compile_init_segments_syncs_and_hooks(tmp_path):
    class Hook:
        def on_episode_end(self, ep):
            pass

    path = tmp_path / "run.trace.json"
    kw = dict(
        num_envs=4, episodes=10, layout=jaxmesh.Layout(segment_steps=16), hooks=Hook()
    )
    traced = jaxmesh.evaluate(lean, "gymnax:CartPole-v1", trace=path, **kw)
    plain = jaxmesh.evaluate(lean, "gymnax:CartPole-v1", **kw)
    np.testing.assert_array_equal(traced.returns, plain.returns)  # no effect
    spans, rows = spans_of(path)
    run = names_on(spans, rows, "run")
    assert run.count("compile") == 1 and run.count("init") == 1
    # Hooks want every episode: each 16-step segment is synced and handed over.
    segments = [e for e in spans if e["name"] == "segment"]
    assert [e["args"]["index"] for e in segments] == list(range(len(segments)))
    assert len(segments) == run.count("host sync") == run.count("hooks") >= 2
    # Spans follow one another: compile, init, then the segments in order.
    first = {name: run.index(name) for name in ("compile", "init", "segment")}
    assert first["compile"] < first["init"] < first["segment"]
    settings = json.loads(path.read_text())["otherData"]["settings"]
    assert settings["num_envs"] == 4 and settings["env"] == "gymnax:CartPole-v1"


def test_an_in_process_run_traces_each_plan_and_env_step(tmp_path):
    path = tmp_path / "host.json"
    envs = [gym.make("CartPole-v1") for _ in range(3)]
    result = jaxmesh.evaluate(lean, envs, num_envs=3, episodes=5, trace=path)
    spans, rows = spans_of(path)
    lanes = names_on(spans, rows, "lanes")
    steps = result.telemetry["predict"]["count"]
    assert lanes.count("plan") == lanes.count("env step") == steps
    assert names_on(spans, rows, "run") == ["compile"]


def test_a_served_run_traces_every_call(tmp_path):
    path = tmp_path / "served.json"
    envs = [gym.make("CartPole-v1") for _ in range(2)]
    with EnvServer(envs, "127.0.0.1:0") as server:
        result = jaxmesh.evaluate(
            lean, f"grpc://{server.address}", num_envs=2, episodes=4, trace=path
        )
    spans, rows = spans_of(path)
    calls = names_on(spans, rows, "server 0")
    tel = result.telemetry
    assert calls.count("encode") == tel["encode"]["count"]
    assert calls.count("call") == calls.count("server step") == tel["wire"]["count"]
    assert calls.count("decode") == tel["decode"]["count"]
    assert names_on(spans, rows, "group 0").count("plan") == tel["predict"]["count"]
    # The server's step is drawn inside its call.
    call = [e for e in spans if e["name"] == "call"]
    step = [e for e in spans if e["name"] == "server step"]
    for c, s in zip(call, step, strict=True):
        assert c["ts"] <= s["ts"] and s["ts"] + s["dur"] <= c["ts"] + c["dur"] + 1


def test_a_failed_run_still_writes_its_trace(tmp_path):
    def overshoot(obs):
        return jnp.where(obs[2] > 0.05, 2, lean(obs)).astype(jnp.int32)

    path = tmp_path / "failed.json"
    with pytest.raises(jaxmesh.BadValueError) as err:
        jaxmesh.evaluate(overshoot, "gymnax:CartPole-v1", episodes=4, trace=path)
    assert err.value.partial_result is not None
    spans, rows = spans_of(path)
    assert "segment" in names_on(spans, rows, "run")


def test_a_bad_trace_path_is_refused_before_compiling(tmp_path, monkeypatch):
    from jaxmesh.run.scan import placement

    def no_compile(*a, **k):
        raise AssertionError("compiled")

    monkeypatch.setattr(placement.SingleDevice, "compile", no_compile)
    with pytest.raises(ValueError, match="does not exist"):
        jaxmesh.evaluate(
            lean, "gymnax:CartPole-v1", trace=tmp_path / "no" / "such" / "t.json"
        )


def test_cli_eval_writes_the_trace(tmp_path):
    from jaxmesh.cli import main

    config = Path(__file__).resolve().parents[1] / "configs" / "cartpole.yaml"
    path = tmp_path / "cli.trace.json"
    out = tmp_path / "out.json"
    code = main(
        [
            "eval",
            str(config),
            "--set",
            "episodes=3",
            "--set",
            f"output={out}",
            "--no-progress",
            "--trace",
            str(path),
        ]
    )
    assert code == 0
    spans, rows = spans_of(path)
    assert "compile" in names_on(spans, rows, "run")
