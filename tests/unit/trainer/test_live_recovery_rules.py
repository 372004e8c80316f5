"""The pure rules of live recovery (docs/fault_tolerance.md): how a step's replica
groups become data-parallel ranks and lanes, what the recovery line says, and the
settings a fault-tolerant job refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from torchtitan.components.recovery_log import RecoveryLog
from torchtitan.components.replica_group_steps import lanes_per_group
from torchtitan.components.step_driver import data_parallel_sizes
from torchtitan.config.job_config import ConfigError, FaultTolerance, load_job_config
from torchtitan.distributed.replica_groups import Membership, quorum_key, store_prefix
from zephon import resolve_layout


def test_groups_times_ranks_are_the_data_parallel_ranks_and_deal_every_lane_once() -> None:
    lanes, per_group = 8, 2
    for groups in (1, 2, 3):
        owned = []
        for index in range(groups):
            for local in range(per_group):
                rank, size = Membership(groups, index).data_parallel(local, per_group)
                layout = resolve_layout(lanes, size, 16, 2)
                owned.append(layout.lanes_of(rank))
        flat = [lane for run in owned for lane in run]
        assert flat == list(range(lanes)), (groups, owned)  # in order, once each
        held = [
            sum(len(r) for r in owned[g * per_group : (g + 1) * per_group]) for g in range(groups)
        ]
        assert lanes_per_group(lanes, groups, per_group) == held
    assert lanes_per_group(8, 3, 2) == [2, 3, 3]  # the issue's uneven case
    # The quorum id does not change the coordinates a membership gives.
    assert Membership(3, 1, quorum=4) == Membership(3, 1, quorum=9)
    assert data_parallel_sizes(FaultTolerance(enable=True, group_count=3), 2) == [2, 4, 6]
    assert data_parallel_sizes(FaultTolerance(), 2) == [2]


def test_recovery_line_names_who_left_the_step_and_the_steps_redone() -> None:
    log = RecoveryLog(replica_id=0)
    log.joined_quorum(1, [0, 1, 2])
    assert log.committed(1, t0=0.0, healed=False, now=1.0) is None  # the start: no recovery
    assert log.started_the_job
    assert log.committed(2, t0=1.0, healed=False, now=2.0) is None
    log.failed(3, t0=2.0)
    log.joined_quorum(2, [0, 2])
    line = log.committed(3, t0=9.0, healed=False, now=9.5)
    assert line is not None
    assert "group 1 left at step 3" in line and "groups now 0,2" in line
    assert "1 step redone" in line and "7.5 s" in line  # from the failed step's start
    log.joined_quorum(3, [0, 1, 2])
    line = log.committed(4, t0=10.0, healed=False, now=11.0)
    assert line is not None and "group 1 joined at step 4" in line and "no step redone" in line
    assert log.committed(5, t0=11.0, healed=False, now=12.0) is None


def test_a_group_that_copied_from_a_peer_did_not_start_the_job() -> None:
    log = RecoveryLog(replica_id=2)
    log.joined_quorum(5, [0, 1, 2])
    line = log.committed(12, t0=0.0, healed=True, now=1.0)
    assert line is not None and "group 2 joined at step 12, copied from a live peer" in line
    assert not log.started_the_job  # so it never trims the job's metrics


FT = ["--fault_tolerance.enable", "true", "--fault_tolerance.group_count", "3"]


@pytest.mark.parametrize(
    ("extra", "env", "names"),
    [
        (["--fault_tolerance.replica_id", "3"], {"FT_LIGHTHOUSE": "h:1"}, ["replica_id = 3", "[0, group_count = 3)"]),
        ([], {"FT_LIGHTHOUSE": "h:1"}, ["replica_id = -1", "FT_REPLICA_ID"]),
        ([], {"FT_LIGHTHOUSE": "h:1", "FT_REPLICA_ID": "x"}, ["FT_REPLICA_ID='x'"]),
        (["--fault_tolerance.min_replicas", "4"], {"FT_REPLICA_ID": "0", "FT_LIGHTHOUSE": "h:1"}, ["min_replicas = 4", "group_count = 3"]),
        ([], {"FT_REPLICA_ID": "0"}, ["lighthouse = ''", "host:port"]),
        (["--data.loader", "hf"], {"FT_REPLICA_ID": "0", "FT_LIGHTHOUSE": "h:1"}, ["loader = 'hf'", "'zephon'"]),
    ],
)  # fmt: skip
def test_each_bad_setting_is_one_error_naming_it(
    extra: list[str], env: dict[str, str], names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("FT_REPLICA_ID", "FT_LIGHTHOUSE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as err:
        load_job_config(FT + extra)
    for name in names:
        assert name in str(err.value)


def test_the_environment_names_the_group_and_the_lighthouse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FT_REPLICA_ID", "2")
    monkeypatch.setenv("FT_LIGHTHOUSE", "10.0.0.5:29510")
    ft = load_job_config(FT).fault_tolerance
    assert (ft.replica_id, ft.lighthouse) == (2, "10.0.0.5:29510")
    # Without fault tolerance the variables are ignored.
    assert load_job_config([]).fault_tolerance.replica_id == -1


def test_fault_tolerance_without_torchft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a)
    )
    monkeypatch.setenv("FT_REPLICA_ID", "0")
    monkeypatch.setenv("FT_LIGHTHOUSE", "h:1")
    with pytest.raises(
        ConfigError, match=r"needs torchft, which is not installed: pip install -e '\.\[ft\]'"
    ):
        load_job_config(FT)


def test_the_timeout_defaults_keep_the_documented_rule() -> None:
    """docs/fault_tolerance.md: the lighthouse's join timeout stays above twice the
    step timeout; the page quotes the defaults the code has."""
    import re

    from helpers import REPO

    from torchtitan.runtime import lighthouse

    defaults = lighthouse.parser().parse_args([])
    step_s = FaultTolerance().step_timeout_s
    assert defaults.join_timeout_ms > 2 * step_s * 1000
    page = (REPO / "docs" / "fault_tolerance.md").read_text()
    assert f"`--join-timeout-ms` ({defaults.join_timeout_ms})" in page
    assert f"`--heartbeat-timeout-ms` ({defaults.heartbeat_timeout_ms})" in page
    assert re.search(rf"\| `step_timeout_s` \| {step_s:g} \|", page)
    assert "Keep it above twice\n`step_timeout_s`" in page


def test_a_communicator_rendezvouses_under_its_quorum_step_and_members() -> None:
    """A lighthouse started again numbers quorums from 1: a quorum that gets an old id
    must not meet the store keys of the communicator that id had (still in use by a
    group that kept it): its step and members (one uuid per process) tell them apart."""
    ids = ["00001:b7c1", "00000:41aa"]
    quorum = SimpleNamespace(max_step=12, replica_ids=ids)
    mine = store_prefix("host:29500/torchft/2/0", quorum)
    assert mine.startswith("host:29500/torchft/2/12-") and mine.endswith("/0")
    peer = store_prefix(
        "host:29500/torchft/2/1", SimpleNamespace(max_step=12, replica_ids=ids[::-1])
    )
    assert peer.rpartition("/")[0] == mine.rpartition("/")[0]  # every rank, either order
    later = store_prefix("host:29500/torchft/2/0", SimpleNamespace(max_step=13, replica_ids=ids))
    again = SimpleNamespace(max_step=12, replica_ids=["00001:b7c1", "00000:9e02"])
    assert len({mine, later, store_prefix("host:29500/torchft/2/0", again)}) == 3
    assert store_prefix("host:29500/torchft/2/0", None) == "host:29500/torchft/2/0"
    # The same id with other members is another quorum; the members' order is not.
    q = SimpleNamespace(quorum_id=1, replica_ids=ids)
    assert quorum_key(q) == quorum_key(SimpleNamespace(quorum_id=1, replica_ids=ids[::-1]))
    assert quorum_key(q) != quorum_key(SimpleNamespace(quorum_id=1, replica_ids=ids[:1]))
    assert quorum_key(q) != quorum_key(SimpleNamespace(quorum_id=2, replica_ids=ids))


def test_the_checkpoint_servers_access_line_goes_to_torchfts_logger(capsys, caplog) -> None:
    """A peer copying this group's state made torchft's HTTP server print an access
    line on stderr; it belongs with torchft's chatter (TORCHTITAN_FT_DEBUG=1)."""
    from http.server import BaseHTTPRequestHandler

    from torchtitan.distributed.replica_groups import _quiet_access_log

    class Handler(BaseHTTPRequestHandler):  # as torchft's server builds its own
        def __init__(self) -> None:
            self.client_address, self.requestline = ("10.0.0.7", 5), "GET /checkpoint/0 HTTP/1.1"

    server = SimpleNamespace(RequestHandlerClass=Handler)
    _quiet_access_log(SimpleNamespace(_checkpoint_transport=SimpleNamespace(_server=server)))
    with caplog.at_level("INFO", logger="torchft.checkpoint_server"):
        Handler().log_request(200)
    assert capsys.readouterr().err == ""
    assert [r.getMessage() for r in caplog.records] == [
        '10.0.0.7 "GET /checkpoint/0 HTTP/1.1" 200 -'
    ]
    _quiet_access_log(SimpleNamespace())  # another torchft: nothing to quiet, no error
