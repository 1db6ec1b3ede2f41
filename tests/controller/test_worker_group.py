"""RayWorkerGroup on a local Ray: 2 CPU workers, every dispatch mode, futures, gloo, colocation."""

import numpy as np
import pytest
import torch

from hybridrl.controller import Dispatch, Worker, make_mesh_dispatch, register
from hybridrl.protocol import DataProto

N_SAMPLES = 2  # rollout-like methods return n samples per prompt, adjacent


class EchoWorker(Worker):
    def __init__(self, scale: int):
        super().__init__()
        self.scale = scale
        self.seen: list[int] = []
        for tp in (1, 2):  # rollout meshes: dp = world / tp, infer_tp rank 0 collects
            self.set_dispatch_info(f"rollout_tp{tp}", self.rank // tp, self.world_size // tp, self.rank % tp == 0)

    @register(Dispatch.ONE_TO_ALL)
    def env(self):
        return self.get_env() | {"local_rank": self.local_rank}

    @register(Dispatch.ALL_TO_ALL)
    def add(self, x, y=0):
        return (self.rank, x + y)

    @register(Dispatch.RANK_ZERO)
    def whoami(self, tag):
        return f"{tag}:{self.rank}"

    @register(Dispatch.DP_COMPUTE_PROTO)
    def scaled(self, data: DataProto, bias: int = 0) -> DataProto:
        self.seen = data.batch["ids"].tolist()
        out = DataProto.from_dict({"ids": data.batch["ids"], "y": data.batch["ids"] * self.scale + bias},
                                  {"rank": [self.rank] * len(data)})
        return out

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def scaled_async(self, data: DataProto) -> DataProto:
        return self.scaled(data)

    def _generate(self, data: DataProto) -> DataProto:
        self.seen = data.batch["ids"].tolist()
        out = data.repeat(N_SAMPLES, interleave=True)
        out.non_tensor_batch["rank"] = np.array([self.rank] * len(out), dtype=object)
        return out

    @register(make_mesh_dispatch("rollout_tp1"))
    def generate_tp1(self, data):
        return self._generate(data)

    @register(make_mesh_dispatch("rollout_tp2"))
    def generate_tp2(self, data):
        return self._generate(data)

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank):
        if self.rank == rank:
            raise KeyError(f"boom on rank {rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def last_seen(self):
        return self.seen

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self):
        import torch.distributed as dist

        backend = self.init_distributed(timeout_s=60)
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return backend, t.item()


class CriticLikeWorker(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def values(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"values": data.batch["y"].float() + 0.5})


def ids(n: int) -> DataProto:
    return DataProto.from_dict({"ids": torch.arange(n)})


@pytest.fixture(scope="module")
def wg(cpu_pool, ship_module_by_value):
    from hybridrl.controller import RayClassWithInitArgs, RayWorkerGroup

    group = RayWorkerGroup(cpu_pool, RayClassWithInitArgs(EchoWorker, 10), name_prefix="echo", worker_timeout_s=60)
    yield group
    group.shutdown()


def test_ranks_and_distributed_env(wg):
    envs = wg.env()
    assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert [e["local_rank"] for e in envs] == [0, 1]
    assert len({e["MASTER_ADDR"] for e in envs}) == 1  # the port is bound at init_distributed (test_rendezvous.py)


def test_all_to_all_and_rank_zero(wg):
    assert wg.add([1, 2], y=[10, 20]) == [(0, 11), (1, 22)]
    with pytest.raises(ValueError, match="world_size=2"):
        wg.add([1, 2, 3])
    assert wg.whoami("t") == "t:0"


def test_dp_compute_proto_uneven_batch(wg):
    out = wg.scaled(ids(5), bias=1)
    assert out.batch["ids"].tolist() == [0, 1, 2, 3, 4]  # padded row (a copy of row 0) removed
    assert out.batch["y"].tolist() == [1, 11, 21, 31, 41]
    assert list(out.non_tensor_batch["rank"]) == [0, 0, 0, 1, 1]
    assert wg.last_seen() == [[0, 1, 2], [3, 4, 0]]
    before = wg.padded_rows.get("scaled", 0)
    wg.scaled(ids(4))
    wg.scaled(ids(3))
    assert wg.padded_rows["scaled"] == before + 1


def test_mesh_dispatch_dp1_tp2_sends_all_rows_to_both_and_collects_rank0(wg):
    out = wg.generate_tp2(ids(5))
    assert out.batch["ids"].tolist() == [i for i in range(5) for _ in range(N_SAMPLES)]
    assert set(out.non_tensor_batch["rank"]) == {0}
    assert wg.last_seen() == [[0, 1, 2, 3, 4]] * 2


def test_mesh_dispatch_dp2_tp1_pads_and_unpads_n_samples(wg):
    out = wg.generate_tp1(data=ids(5))
    assert out.batch["ids"].tolist() == [i for i in range(5) for _ in range(N_SAMPLES)]
    assert list(out.non_tensor_batch["rank"]) == [0] * 6 + [1] * 4
    assert wg.last_seen() == [[0, 1, 2], [3, 4, 0]]


def test_futures_forward_chunks_without_driver(wg):
    first = wg.scaled_async(ids(4))  # blocking=False in the decorator
    second = wg.scaled.remote(first)  # DP chunks match: forwarded worker to worker
    out = second.get()
    assert not first._done  # the first result never went through the driver
    assert out.batch["ids"].tolist() == [0, 1, 2, 3]
    assert wg.last_seen() == [[0, 1], [2, 3]]
    padded = wg.scaled.remote(ids(3))  # padded chunks are resolved and re-split instead
    assert wg.scaled(padded).batch["ids"].tolist() == [0, 1, 2]
    assert padded._done
    assert wg.whoami.remote(wg.whoami.remote("x")).get() == "x:0:0"


def test_gloo_all_reduce_after_init_distributed(wg):
    assert wg.all_reduce_rank() == [("gloo", 3.0), ("gloo", 3.0)]


def test_second_role_shares_the_pool_and_chains_a_future(cpu_pool, wg):
    from hybridrl.controller import RayClassWithInitArgs, RayWorkerGroup

    critic = RayWorkerGroup(cpu_pool, RayClassWithInitArgs(CriticLikeWorker), worker_timeout_s=60)
    try:
        out = critic.values(wg.scaled.remote(ids(4)))
        assert out.batch["values"].tolist() == [0.5, 10.5, 20.5, 30.5]
    finally:
        critic.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        critic.values(ids(2))


def test_worker_exception_reaches_driver_with_rank_and_traceback(wg):
    from hybridrl.controller import WorkerError

    with pytest.raises(WorkerError) as info:
        wg.fail_on(1)
    assert info.value.rank == 1 and info.value.method == "fail_on"
    message = str(info.value)
    assert "worker traceback" in message and "in fail_on" in message and 'raise KeyError(f"boom' in message
    assert wg.fail_on(-1) == [0, 1]  # an exception leaves the workers alive


def test_a_local_ray_drops_only_its_token_auth_notice(monkeypatch):
    """Ray's notice that it turned token authentication on asks nothing of the user: it is dropped, and every other
    record of the same logger (the warning that a cluster runs without authentication, say) still shows."""
    import logging

    from ray._private.authentication import authentication_token_setup as ray_auth

    from hybridrl.controller.resource_pool import _quiet_default_token_auth_notice

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    _quiet_default_token_auth_notice()
    _quiet_default_token_auth_notice()  # idempotent: one filter
    ray_logger = logging.getLogger(ray_auth.__name__)
    assert len(ray_logger.filters) == 1
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    ray_logger.addHandler(handler)  # Ray's loggers do not propagate to the root, where caplog listens
    try:
        ray_auth._warn_token_auth_enabled()
        ray_auth._warn_token_auth_disabled()
    finally:
        ray_logger.removeHandler(handler)
    messages = seen
    assert len(messages) == 1 and messages[0].startswith("Token authentication is disabled"), messages
