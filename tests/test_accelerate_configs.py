"""configs/accelerate/*.yaml are valid for the installed accelerate: its own loader reads them, every
nested key is an option `accelerate launch` knows (the launcher copies unknown nested keys onto its
arguments without a word, so a misspelt key would be ignored), and the launcher's environment for
each file builds accelerate's FSDP / DeepSpeed plugin, whose checks (FSDP version, wrap policy, state
dict type, ZeRO stage, offload devices) then run. No GPU and no DeepSpeed install needed."""

import os
import warnings
from pathlib import Path
from unittest import mock

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs/accelerate").glob("*.yaml"))
EXPECTED = {
    "single_gpu": DistributedType.NO,
    "ddp": DistributedType.MULTI_GPU,
    "multi_node": DistributedType.MULTI_GPU,
    "fsdp": DistributedType.FSDP,
    "deepspeed_zero2": DistributedType.DEEPSPEED,
    "deepspeed_zero3": DistributedType.DEEPSPEED,
}


def test_the_documented_configs_are_there():
    assert {p.stem for p in CONFIGS} == set(EXPECTED)


# The nested sections and the prefix `accelerate launch` gives their keys (commands/launch.py).
SECTIONS = {"fsdp_config": "fsdp_", "deepspeed_config": "", "dynamo_config": "dynamo_"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_loads_with_accelerates_loader_and_every_key_is_known(path):
    config = load_config_from_file(str(path))  # raises on unknown top-level keys
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type == EXPECTED[path.stem]
    assert config.mixed_precision in ("no", "fp16", "bf16", "fp8")
    options = {action.dest for action in launch_command_parser()._actions}
    for section, prefix in SECTIONS.items():
        for key in getattr(config, section) or {}:
            name = key if key.startswith(prefix) else prefix + key
            assert name in options, f"{path.name}: {section}.{key} is not an `accelerate launch` option"


def _launcher_env(path: Path) -> tuple[object, dict[str, str]]:
    """The arguments and the environment `accelerate launch --config_file PATH` gives its processes."""
    args = launch_command_parser().parse_args(["--config_file", str(path), "vprl/train/rl.py"])
    args, defaults, mixed_precision_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mixed_precision_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        return args, prepare_deepspeed_cmd_env(args)[1]
    if args.use_fsdp or args.multi_gpu:
        return args, prepare_multi_gpu_env(args)
    return args, prepare_simple_launcher_cmd_env(args)[1]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_the_launcher_accepts_it_and_builds_its_plugin(path):
    args, env = _launcher_env(path)
    assert env["ACCELERATE_MIXED_PRECISION"] == load_config_from_file(str(path)).mixed_precision
    kind = EXPECTED[path.stem]
    with mock.patch.dict(os.environ, env, clear=True):
        if kind == DistributedType.FSDP:
            plugin = FullyShardedDataParallelPlugin()
            assert plugin.fsdp_version == 2 and plugin.auto_wrap_policy is not None
            # Trainer.save_model writes nothing under FSDP unless the state dict is gathered whole:
            # the run's final adapter depends on it.
            assert plugin.state_dict_type.name == "FULL_STATE_DICT"
        elif kind == DistributedType.DEEPSPEED:
            plugin = DeepSpeedPlugin()
            stage = int(path.stem.rsplit("zero", 1)[1])
            assert plugin.zero_stage == stage
            assert plugin.deepspeed_config["zero_optimization"]["stage"] == stage
        elif kind == DistributedType.MULTI_GPU:
            assert args.multi_gpu and not args.use_fsdp and not args.use_deepspeed
        else:
            assert not (args.multi_gpu or args.use_fsdp or args.use_deepspeed) and args.num_processes == 1


def test_a_run_that_silently_lost_its_sharding_warns(monkeypatch):
    from types import SimpleNamespace

    from vprl.train.online.run import check_sharding

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    with pytest.warns(RuntimeWarning, match="launched with FSDP"):
        check_sharding(SimpleNamespace(is_fsdp_enabled=False, is_deepspeed_enabled=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_sharding(SimpleNamespace(is_fsdp_enabled=True, is_deepspeed_enabled=False))
