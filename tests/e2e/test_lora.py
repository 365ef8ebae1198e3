"""LoRA over gRPC: per-request adapters on AddRequest and Generate, and the Control RPCs
AddLora / RemoveLora / ListLoras / PinLora, through real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core import LoRARequest, RequestOutput
from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import control_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import EngineClient, RequestError
from strand.services.launch import Stack, StackConfig, launch_stack
from tests.e2e.conftest import ENGINE_FLAGS
from tests.engine_core.engine.conftest import run_to_completion
from tests.engine_core.lora.conftest import (
    GREEDY,
    PROMPT,
    generate,
    make_lora_engine,
    make_peft_adapter,
)

LORA_FLAGS = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
              "--max-cpu-loras", "3"]


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("e2e-adapters")
    return {"a": make_peft_adapter(tiny_model_dir, root / "a", seed=3, r=8),
            "b": make_peft_adapter(tiny_model_dir, root / "b", seed=4, r=4, alpha=4,
                                   targets=["q_proj", "v_proj", "down_proj"])}


@pytest.fixture(scope="module")
def lora_stack(tiny_model_dir: Path, adapter_dirs: dict[str, Path],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Manual stepping, with the OpenAI front serving adapter "a" as model "sql"."""
    config = StackConfig(model=str(tiny_model_dir), engine_args=[*ENGINE_FLAGS, *LORA_FLAGS],
                         log_dir=tmp_path_factory.mktemp("lora-logs"), openai_port=0,
                         openai_args=["--lora-modules", f"sql={adapter_dirs['a']}"])
    with launch_stack(config, timeout=120) as s:
        yield s


@pytest.fixture
def lora_client(lora_stack: Stack) -> Iterator[EngineClient]:
    with EngineClient(lora_stack.gateway_address, timeout=60) as c:
        yield c
        assert c.get_num_unfinished_requests() == 0


def _served(client: EngineClient, jobs: dict[str, LoRARequest | None]) -> dict[str, list[int]]:
    for request_id, lora in jobs.items():
        client.add_request(request_id, {"prompt_token_ids": PROMPT}, GREEDY, lora_request=lora)
    done: dict[str, list[int]] = {}
    while client.has_unfinished_requests():
        for out in client.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return done


def test_adapters_over_grpc_match_the_engine_in_process(
        tiny_model_dir: Path, adapter_dirs: dict[str, Path], lora_client: EngineClient) -> None:
    a = LoRARequest("a", 1, str(adapter_dirs["a"]))
    b = LoRARequest("b", 2, str(adapter_dirs["b"]))
    jobs = {"ra": a, "rb": b, "rbase": None}
    want = generate(make_lora_engine(tiny_model_dir), jobs)
    assert want["ra"] != want["rbase"] and want["rb"] != want["rbase"]
    assert _served(lora_client, jobs) == want
    # Generate (a stream of its own) carries the adapter too.
    streamed = list(lora_client.generate({"prompt_token_ids": PROMPT}, GREEDY, lora_request=b))
    assert list(streamed[-1].outputs[0].token_ids) == want["rb"]
    assert streamed[-1].lora_request == b  # RequestOutput names its adapter over gRPC too


def test_control_rpcs_add_list_pin_remove(adapter_dirs: dict[str, Path],
                                          lora_client: EngineClient) -> None:
    for lora_id in lora_client.list_loras():
        lora_client.remove_lora(lora_id)
    assert lora_client.add_lora(LoRARequest("a", 7, str(adapter_dirs["a"]))) is True
    assert lora_client.list_loras() == {7}
    assert lora_client.pin_lora(7) is True
    assert lora_client.remove_lora(8) is False
    assert lora_client.remove_lora(7) is True
    assert lora_client.list_loras() == set()


def test_bad_adapters_are_invalid_argument(tmp_path: Path, adapter_dirs: dict[str, Path],
                                           lora_stack: Stack, lora_client: EngineClient) -> None:
    before = lora_client.list_loras()
    with pytest.raises(RequestError, match="adapter_config.json") as missing:
        lora_client.add_lora(LoRARequest("none", 9, str(tmp_path / "missing")))
    assert missing.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(RequestError, match="lora_id 9 is not loaded"):
        lora_client.pin_lora(9)
    # A raw stub: EngineClient's LoRARequest would refuse the id before sending it.
    with grpc.insecure_channel(lora_stack.gateway_address) as channel:
        with pytest.raises(grpc.RpcError) as bad_id:
            control_pb2_grpc.ControlStub(channel).AddLora(cpb.AddLoraRequest(
                lora_request=pb.LoRARequest(lora_name="x", lora_int_id=0, lora_path="/x")))
    assert bad_id.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "lora_int_id must be an int >= 1" in (bad_id.value.details() or "")
    with pytest.raises(RequestError, match="adapter_config.json"):
        lora_client.add_request("bad", {"prompt_token_ids": PROMPT}, GREEDY,
                                lora_request=LoRARequest("none", 9, str(tmp_path / "missing")))
    assert lora_client.list_loras() == before


def test_lora_without_enable_lora_is_invalid_argument(client: EngineClient,
                                                      adapter_dirs: dict[str, Path]) -> None:
    with pytest.raises(RequestError, match="enable_lora"):
        client.add_lora(LoRARequest("a", 1, str(adapter_dirs["a"])))
    with pytest.raises(RequestError, match="enable_lora"):
        client.add_request("no-lora", {"prompt_token_ids": PROMPT}, GREEDY,
                           lora_request=LoRARequest("a", 1, str(adapter_dirs["a"])))


def test_openai_front_serves_a_lora_module_by_model_name(
        tiny_model_dir: Path, adapter_dirs: dict[str, Path], lora_stack: Stack) -> None:
    openai = pytest.importorskip("openai")
    sql = LoRARequest("sql", 1, str(adapter_dirs["a"]))  # --lora-modules gives ids from 1
    engine = make_lora_engine(tiny_model_dir)
    for request_id, lora in (("sql", sql), ("base", None)):
        engine.add_request(request_id, {"prompt_token_ids": PROMPT}, GREEDY, lora_request=lora)
    want = {rid: out.outputs[0].text for rid, out in run_to_completion(engine).items()}
    assert want["sql"] != want["base"]
    base_url = f"http://{lora_stack.address('openai')}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as api:
        models = {m.id: m for m in api.models.list().data}
        assert set(models) == {lora_stack.config.model, "sql"}
        for model, name in ((lora_stack.config.model, "base"), ("sql", "sql")):
            # The front steps nobody's stream; a Generate stream steps itself after a second.
            done = api.completions.create(model=model, prompt=PROMPT, max_tokens=10,
                                          temperature=0.0, extra_body={"ignore_eos": True})
            assert done.model == model
            assert done.usage is not None and done.usage.completion_tokens == 10
            assert done.choices[0].text == want[name]
        with pytest.raises(openai.NotFoundError):
            api.completions.create(model="no-such-adapter", prompt="x", max_tokens=1)

