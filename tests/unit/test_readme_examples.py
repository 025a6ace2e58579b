"""Every YAML example in README.md and docs/ validates: a user who copies one gets a working config."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from flows.config import PipelineConfig
from infra.config import parse_config
from tasks.data.catalog import load_catalog
from tasks.training.sft.data import load_sft_catalog
from tests.conftest import ROOT

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]  # docs/experiments/ are dated logs, not instructions
_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def yaml_examples() -> list[str]:
    return [block for doc in DOCS for block in _BLOCK.findall(doc.read_text(encoding="utf-8"))]


def _materialise(pattern: str, root: Path) -> None:
    """Create one file the example's path (a file, folder or glob) would match."""
    target = root / pattern.replace("**/", "").replace("*", "sample")
    if target.suffix:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"")
    else:
        target.mkdir(parents=True, exist_ok=True)


def test_readme_has_yaml_examples():
    assert _BLOCK.findall(README.read_text(encoding="utf-8")), "README.md should show at least one YAML example"


@pytest.mark.parametrize("index", range(len(yaml_examples())))
def test_readme_yaml_example_validates(index, tmp_path):
    text = yaml_examples()[index]
    data = yaml.safe_load(text)
    if "kind" in data:  # a data_catalog/ source definition
        catalog = tmp_path / "catalog"
        catalog.mkdir()
        if data.get("path"):
            _materialise(data["path"], catalog)
        if data.get("hf", {}).get("name") and not data["hf"].get("data_files"):  # a local dataset folder
            (catalog / data["hf"]["name"]).mkdir(parents=True)
        (catalog / f"{data['name']}.yaml").write_text(text, encoding="utf-8")
        if str(data["kind"]).startswith("sft_"):  # an SFT source (sft.data.catalog)
            assert [s.name for s in load_sft_catalog(catalog)] == [data["name"]]
        else:
            assert [s.name for s in load_catalog(catalog).sources] == [data["name"]]
    elif "variants" in data:  # an ablation file (docs/ablations.md)
        from flows.ablation_spec import load_spec
        from flows.config import check_override_keys

        for sets in data["variants"].values():  # every key a variant sets is a key of the config
            check_override_keys(list(sets))
        for path in data.get("targets", {}).values():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text('{"text": "x"}\n')
        (tmp_path / "ablation.yaml").write_text(text, encoding="utf-8")
        assert set(load_spec(tmp_path / "ablation.yaml").variants) == set(data["variants"])
    else:  # a preset (infra/presets/*.yaml shape)
        parse_config(PipelineConfig, data, origin=f"yaml example {index}")
