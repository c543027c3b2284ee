"""What older transformers built as buffers, model by model: the fixture ``profkit.model.legacy_buffers`` is held to.

Each model of the published set (``tests/data/published/models.json``) is built on the meta device, in fp16 as
``from_pretrained(torch_dtype=torch.float16)`` builds it, under each transformers version given, and its buffers
are written to ``tests/data/legacy_buffers.json`` beside the installed version's. The versions are unpacked
wheels (``pip download --no-deps transformers==4.35.2`` then ``unzip``): this script downloads nothing, and each
version runs in a process of its own with its wheel first on the path (its dependency pins are not checked: only
its modelling code runs).

    python analyses/legacy_buffers.py /tmp/tf/full4.35.2 /tmp/tf/full4.40.2 ...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "published" / "models.json"
OUT = ROOT / "tests" / "data" / "legacy_buffers.json"

BUILD = r"""
import json, logging, sys, warnings
import torch
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
import transformers
out = {}
for name, entry in json.load(open(sys.argv[1])).items():
    config = dict(entry.get("config", {}))
    model_type = config.pop("model_type", None)
    if model_type not in CONFIG_MAPPING or entry.get("unsupported"):
        continue
    try:
        cfg = AutoConfig.for_model(model_type, **config)
        torch.set_default_dtype(torch.float16)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:
        out[name] = {"model_type": model_type, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}
        continue
    finally:
        torch.set_default_dtype(torch.float32)
    buffers = {}
    for key, b in model.named_buffers():
        kind = f"{key.split('.')[-1]} {tuple(b.shape)} {str(b.dtype).removeprefix('torch.')}"
        buffers[kind] = buffers.get(kind, 0) + 1
    out[name] = {"model_type": model_type, "bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
                 "buffers": buffers}
print(json.dumps({"version": transformers.__version__, "models": out}))
"""

PINS = "require_version_core(deps[pkg])"


def build(wheel: Path | None) -> dict:
    env = dict(os.environ)
    if wheel is not None:
        # An old wheel pins older tokenizers and hub clients than the installed ones; its modelling code does
        # not need them to build a model on the meta device.
        check = wheel / "transformers" / "dependency_versions_check.py"
        text = check.read_text()
        if PINS in text:
            check.write_text(text.replace(PINS, "pass  # pins not checked: analyses/legacy_buffers.py"))
        env["PYTHONPATH"] = str(wheel)
    done = subprocess.run([sys.executable, "-c", BUILD, str(MODELS)], env=env, capture_output=True, text=True,
                          timeout=900)
    if done.returncode:
        raise SystemExit(f"{wheel or 'installed'}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(wheels: list[str]) -> None:
    installed = build(None)
    versions = {}
    for wheel in wheels:
        built = build(Path(wheel))
        versions[built["version"]] = built["models"]
        print(f"{built['version']}: {len(built['models'])} models", file=sys.stderr)
    OUT.write_text(json.dumps({"dtype": "float16", "installed": installed, "versions": versions}, indent=1,
                              sort_keys=True) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
