"""create_connector: --kv-connector names, the JSON config, and the tier's byte budget."""

from __future__ import annotations

import pytest
import torch

from strand.engine_core.config import EngineArgs
from strand.engine_core.connector.factory import create_connector
from strand.engine_core.connector.multi import MultiConnector
from strand.engine_core.connector.offload import OffloadConnector
from tests.engine_core.connector.conftest import bytes_per_block, fake_runner


def test_offload_tier_holds_as_many_blocks_as_the_byte_budget_allows() -> None:
    runner = fake_runner()
    args = EngineArgs(kv_connector="offload", kv_offload_bytes=5 * bytes_per_block() + 1)
    connector = create_connector(args, runner, num_blocks=8)
    assert isinstance(connector, OffloadConnector)
    assert connector.tier.num_slots == 5
    assert connector.tier.buffer.dtype == torch.float32
    assert runner.kv_connector is connector  # the worker side is attached to the runner


def test_the_tier_uses_the_models_dtype_for_its_budget() -> None:
    runner = fake_runner(dtype=torch.bfloat16)
    args = EngineArgs(kv_connector="offload", kv_offload_bytes=4 * bytes_per_block(torch.float32))
    connector = create_connector(args, runner, num_blocks=8)
    assert isinstance(connector, OffloadConnector)
    assert connector.tier.num_slots == 8
    assert connector.tier.buffer.dtype == torch.bfloat16


def test_config_may_set_the_number_of_cpu_blocks() -> None:
    args = EngineArgs(kv_connector="offload", kv_connector_config={"num_cpu_blocks": 3})
    connector = create_connector(args, fake_runner(), num_blocks=8)
    assert isinstance(connector, OffloadConnector)
    assert connector.tier.num_slots == 3


def test_an_offload_budget_below_one_block_is_rejected() -> None:
    args = EngineArgs(kv_connector="offload", kv_offload_bytes=bytes_per_block() - 1)
    with pytest.raises(ValueError, match="kv_offload_bytes must be >= one block"):
        create_connector(args, fake_runner(), num_blocks=8)


def test_an_unknown_connector_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="kv_connector must be one of"):
        create_connector(EngineArgs(kv_connector="disk"), fake_runner(), num_blocks=8)


def test_an_unknown_config_key_is_rejected() -> None:
    args = EngineArgs(kv_connector="offload", kv_offload_bytes=1 << 20,
                      kv_connector_config={"num_gpu_blocks": 3})
    with pytest.raises(ValueError, match="kv_connector_config keys"):
        create_connector(args, fake_runner(), num_blocks=8)


def test_multi_builds_its_children_from_the_config() -> None:
    child = {"kv_connector": "offload", "kv_connector_config": {"num_cpu_blocks": 2}}
    args = EngineArgs(kv_connector="multi", kv_connector_config={"connectors": [child, child]})
    connector = create_connector(args, fake_runner(), num_blocks=8)
    assert isinstance(connector, MultiConnector)
    assert [type(c) for c in connector.connectors] == [OffloadConnector, OffloadConnector]
    assert connector.locations == ("cpu", "cpu")


def test_multi_without_children_is_rejected() -> None:
    args = EngineArgs(kv_connector="multi", kv_connector_config={"connectors": []})
    with pytest.raises(ValueError, match="kv_connector_config.connectors must be a non-empty"):
        create_connector(args, fake_runner(), num_blocks=8)
