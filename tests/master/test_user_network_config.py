"""A user's network and env on the master's command line: --policy package.module:callable and
--policy-options, a module:Env-id, what config.json and genome files record of them, and every
setting that does not fit refused by name before a run dir exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from master.cli import _dir_name, _resolve_config, build_parser
from master.config import RunConfig, inspect_env_id, preset
from master.fleet.tasks import task_template
from neuro.genome import Genome
from neuro.policy_spec import user_policy
from neuro.v1 import evolution_pb2 as pb
from tests.support.user_problem import MLP_FACTORY, MY_ENV, USER_PACKAGES
from worker.client.wire import spec_from_task


@pytest.fixture(autouse=True)
def user_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(USER_PACKAGES))


def _config(tmp_path: Path, *flags: str) -> RunConfig:
    parser = build_parser()
    args = parser.parse_args(["--env", MY_ENV, *flags])
    config, resume = _resolve_config(parser, args, tmp_path / "run")
    assert resume is None
    return config


def test_policy_names_a_factory_and_policy_options_its_arguments(tmp_path: Path) -> None:
    config = _config(tmp_path, "--policy", MLP_FACTORY, "--policy-options", '{ "hidden": 8 }')
    assert (config.architecture, config.policy_factory) == ("module", MLP_FACTORY)
    assert config.policy == user_policy(MLP_FACTORY, {"hidden": 8})
    assert config.policy_options == '{"hidden":8}'
    assert config.hidden_sizes == () and config.inference_dtype == "float32"
    assert config.env_id == MY_ENV and not config.atari
    assert config.episode_step_limit == 200  # the package's own registration
    # config.json records the factory and its options as an object, and reads back equal.
    document = json.loads(json.dumps(config.to_dict()))
    assert document["architecture"] == "module" and document["policy_factory"] == MLP_FACTORY
    assert document["policy_options"] == {"hidden": 8}
    assert RunConfig.from_dict(document) == config
    # A genome file names the network, for neuro-eval to rebuild it.
    genome = config.genome_document(Genome((5, 6)))
    assert genome["policy"] == {"factory": MLP_FACTORY, "options": {"hidden": 8}}


def test_a_built_in_networks_records_are_as_they_were() -> None:
    config = preset(inspect_env_id("CartPole-v1"))
    assert "policy_factory" not in config.to_dict() and "policy_options" not in config.to_dict()
    assert "policy" not in config.genome_document(Genome((1,)))
    assert config.policy is None


def test_the_task_carries_the_network_and_the_worker_reads_it_back(tmp_path: Path) -> None:
    config = _config(tmp_path, "--policy", MLP_FACTORY, "--policy-options", '{"hidden": 8}')
    template = task_template(config)
    response = pb.LeaseResponse()
    task = response.tasks.add()
    task.CopyFrom(template._prototype)
    task.task_id, task.episodes = "g0/0", 1
    task.genome.seeds.append(7)
    spec = spec_from_task(task)
    assert spec.architecture == "module" and spec.policy == config.policy
    built_in = task_template(preset(inspect_env_id("CartPole-v1")))._prototype.policy
    assert (built_in.factory, built_in.options) == ("", "")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--policy", "my-pkg:make"], r"--policy: architecture names no factory .*my-pkg:make"),
        (["--policy", "resnet"], r"--policy: architecture must be one of deepga, nature, mlp or"),
        (["--policy", MLP_FACTORY, "--policy-options", "[8]"], "must be a JSON object"),
        (["--policy", MLP_FACTORY, "--policy-options", "hidden=8"], "not JSON"),
        (["--policy-options", '{"hidden": 8}'], "--policy-options are a user's network's"),
        (["--policy", MLP_FACTORY, "--hidden", "8"], "--hidden is the mlp's"),
        (["--policy", MLP_FACTORY, "--inference-dtype", "int8"], "'int8' runs on the deepga"),
        (["--policy", "module"], "give --policy package.module:callable"),
        (["--policy", "not_installed_nets:make"], r"cannot import module 'not_installed_nets'.*"
                                                  r"must be importable here too"),
        (["--policy", "userpkg.nets:make_fixed"], None),  # builds: its outputs are the worker's
        (["--policy", MLP_FACTORY, "--policy-options", '{"depth": 2}'], "failed: TypeError"),
        (["--policy", MLP_FACTORY, "--policy-options", '{"hidden": 5000}',
          "--noise-table-size", "10000"], r"more than the noise table.*--noise-table-size"),
        (["--env", "not_installed_envs:Thing-v0"], "cannot import module 'not_installed_envs'"),
    ],
)  # fmt: skip
def test_what_does_not_fit_is_refused_by_name_before_the_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str | None
) -> None:
    run_dir = tmp_path / "run"
    parser = build_parser()
    if message is None:
        _resolve_config(parser, parser.parse_args(["--env", MY_ENV, *flags]), run_dir)
        return
    with pytest.raises(SystemExit) as exit_info:
        _resolve_config(parser, parser.parse_args(["--env", MY_ENV, *flags]), run_dir)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert re.search(message, error, re.S), error
    assert not run_dir.exists()


def test_a_module_env_ids_run_dir_is_named_without_its_colon() -> None:
    assert _dir_name(MY_ENV) == "userpkg_MyEnv-v0" and _dir_name("ALE/Pong-v5") == "ALE_Pong-v5"


def test_a_master_without_the_envs_package_names_it_on_resume_and_keeps_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from master.run.checkpoint import save_checkpoint

    config = preset(inspect_env_id(MY_ENV), architecture=MLP_FACTORY).to_dict()
    config["env_id"] = "not_installed_pkg:MyEnv-v0"  # the run's package, missing on this host
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    payload = {"config": config, "algorithm": {"name": "ga", "state": {"generation": 3}}}
    save_checkpoint(run_dir, payload)
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_info:
        _resolve_config(parser, parser.parse_args(["--env", config["env_id"]]), run_dir)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "cannot import module 'not_installed_pkg' (env not_installed_pkg:MyEnv-v0)" in error
    assert "cannot be resumed" not in error  # the checkpoint is fine: install the package
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before
