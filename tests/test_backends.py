"""The one door to a tool backend (`vprl.executor.backends`, #36 item 1): a stack by name, by a user's
path or as a mapping; the oracle's rule (scene graphs from the stack, the overrides or the shapes
worlds, else a one-line error naming the file); the service's rule (a deployed stack takes no
overrides); and the check that validates a stack and its overrides without loading any model."""

from __future__ import annotations

import pytest
import yaml

from vprl.data.shapes import BuildConfig, build_dataset
from vprl.data.shapes.tasks import scene_graph_files
from vprl.executor.backends import check_backend, open_backend
from vprl.executor.tools.oracle import OracleBackend
from vprl.executor.tools.shapes import ShapesBackend
from vprl.executor.tools.stack import NAMED_STACKS


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    build_dataset(BuildConfig(out=str(root), train=2, val=2, winoground=0, sugarcrepe=0, refcoco=0, seed=0, workers=1))
    return root


def test_a_stack_by_name_path_or_mapping_opens_the_same_backend(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text(yaml.safe_dump({"backend": "shapes"}))
    for stack in ("shapes", NAMED_STACKS / "shapes.yaml", str(own), {"backend": "shapes"}):
        assert isinstance(open_backend(stack), ShapesBackend), stack


def test_the_oracle_needs_scene_graphs_and_takes_a_worlds_own(world, tmp_path):
    with pytest.raises(ValueError, match=r"stacks/oracle\.yaml: the oracle backend needs `scene_graphs:`") as err:
        open_backend("oracle")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"oracle\.yaml: the oracle backend needs"):
        check_backend("oracle")
    backend = open_backend("oracle", worlds=[world])
    assert isinstance(backend, OracleBackend) and backend.scenes
    assert backend.config["scene_graphs"] == [str(p) for p in scene_graph_files(world)]
    # the stack's or the overrides' own scene graphs win over the world's
    val = str(world / "gqa" / "val_sceneGraphs.json")
    _, overrides = check_backend("oracle", worlds=[world], scene_graphs=val)
    assert overrides == {"scene_graphs": val}
    # a user's stack file: its relative scene graphs are read from the file's folder, as before
    folder = tmp_path / "stacks"
    folder.mkdir()
    (folder / "graphs.json").write_text((world / "gqa" / "val_sceneGraphs.json").read_text())
    (folder / "mine.yaml").write_text(yaml.safe_dump({"backend": "oracle", "scene_graphs": "graphs.json"}))
    assert open_backend(folder / "mine.yaml", worlds=[world]).config["scene_graphs"] == str(folder / "graphs.json")


def test_a_deployed_stack_takes_no_overrides():
    with pytest.raises(ValueError, match=r"tool_overrides \['min_visible'\]: a deployed tool service runs the stack"):
        open_backend("oracle", service="auto", min_visible=0.3)
    with pytest.raises(ValueError, match=r"tool_overrides \['min_visible'\]"):
        check_backend("oracle", "auto", min_visible=0.3)
    # nor does it need the oracle's scene graphs here: the service's replicas have them
    config, overrides = check_backend("oracle", "auto")
    assert config["backend"] == "oracle" and overrides == {}


def test_the_check_names_the_file_and_the_setting_and_loads_nothing(world):
    config, overrides = check_backend("viunit", detect={"box_threshold": 0.1})
    assert config["backend"] == "hf" and overrides == {"detect": {"box_threshold": 0.1}}
    with pytest.raises(ValueError, match=r"stacks/viunit\.yaml: bad settings for the 'hf' backend: .*box_treshold"):
        check_backend("viunit", detect={"box_treshold": 0.1})
    with pytest.raises(ValueError, match=r"stacks/oracle\.yaml: bad settings for the 'oracle' backend: .*min_visible"):
        check_backend("oracle", worlds=[world], min_visible="high")
    with pytest.raises(ValueError, match=r"^tool stack: unknown tool backend 'nope'"):
        check_backend({"backend": "nope"})
    with pytest.raises(FileNotFoundError, match=r"'shape': no file of that name and no named stack"):
        check_backend("shape")
