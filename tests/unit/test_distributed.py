"""The distributed runtime: torchrun variables, device/backend choice, single-process mode, rank logging."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist

from distqa.config import ConfigError
from distqa.distributed.runtime import (
    all_gather_objects,
    all_reduce_mean,
    choose_device,
    distributed_runtime,
    read_torchrun_env,
    setup_logging,
)

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def test_unlaunched_process_is_rank_0_of_1_without_a_group() -> None:
    with distributed_runtime("auto", environ={}) as runtime:
        assert (runtime.rank, runtime.world_size, runtime.local_rank, runtime.node_rank) == (0, 1, 0, 0)
        assert not runtime.is_distributed
        assert not dist.is_initialized()
        assert runtime.is_main_process
        assert all_gather_objects({"a": 1}) == [{"a": 1}]
    assert not dist.is_initialized()


def test_torchrun_variables_are_read() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert read_torchrun_env(env) == {"RANK": 5, "LOCAL_RANK": 1, "WORLD_SIZE": 8, "LOCAL_WORLD_SIZE": 2,
                                      "GROUP_RANK": 2}


@pytest.mark.parametrize(("env", "message"), [
    ({"RANK": "one"}, "RANK='one' is not an integer"),
    ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "RANK=3 is outside"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR/MASTER_PORT are not set"),
])
def test_bad_torchrun_variables_are_explained(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_torchrun_env(env)


def test_cpu_pairs_with_gloo_and_cuda_is_refused_without_gpus() -> None:
    assert choose_device("cpu", 0) == (choose_device("auto", 0)[0], "gloo")
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        choose_device("cuda", 0)


def test_group_is_torn_down_when_the_body_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from support.processes import free_port

    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # World size 1 never creates a group; create one by hand to prove `finally` destroys it.
    dist.init_process_group("gloo", rank=0, world_size=1)

    def failing_body() -> None:
        with distributed_runtime("cpu", environ=env):
            assert dist.is_initialized()
            assert all_reduce_mean(torch.tensor(3.0)).item() == 3.0
            raise RuntimeError("boom")

    try:
        with pytest.raises(RuntimeError, match="boom"):
            failing_body()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_every_log_line_carries_the_rank(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    log_file = tmp_path / "rank-3.log"
    setup_logging(3, log_file)
    logging.getLogger("distqa.test").info("hello")
    for handler in logging.getLogger().handlers:
        handler.flush()
    assert "[rank 3] INFO distqa.test: hello" in log_file.read_text()
    assert "[rank 3]" in capsys.readouterr().err
