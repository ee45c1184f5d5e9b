"""The telemetry table, as ``format_telemetry`` and the HTML report print it,
of a real served run: a server on 127.0.0.1, its sessions on the same-host
shared-memory path. A flag (``transport_shm``) is printed as a share and an
event series as a count, never as a time."""

from __future__ import annotations

import re

import pytest
from gym_reference import ID, lean

import jaxmesh
from jaxmesh.remote.server import EnvServer


@pytest.fixture(scope="module")
def served():
    with EnvServer(f"gymnasium:{ID}", "127.0.0.1:0", lanes=2) as server:
        yield jaxmesh.evaluate(
            lean, f"grpc://{server.address}", num_envs=2, seeds=[0, 1, 2]
        )


def test_a_flag_is_a_share_and_times_are_milliseconds(served):
    stats = served.telemetry["transport_shm"]
    assert (stats["count"], stats["mean"]) == (1, 1.0)  # one session, on shm
    lines = {line.split()[0]: line for line in served.format_telemetry().splitlines()}
    assert re.fullmatch(r"transport_shm +1 +100% yes", lines["transport_shm"])
    assert "ms" not in lines["transport_shm"]
    predict = served.telemetry["predict"]
    assert f"{1000 * predict['p50']:.3f} ms" in lines["predict"]


def test_the_report_prints_the_flag_as_the_text_does(served, tmp_path):
    pytest.importorskip("matplotlib")
    html = served.report(tmp_path / "r.html").read_text()
    row = re.search(r"<tr data-key='transport_shm'.*?</tr>", html, re.S).group(0)
    cells = re.findall(r"<td>(.*?)</td>", row)
    assert cells == ["1", "100% yes", "", "", ""]
